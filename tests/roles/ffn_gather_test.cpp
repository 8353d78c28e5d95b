// The FFN's lockstep tracker (roles/ffn_gather.h): whom a gathering FFN rank waits for, and
// whom it serves first so that attention ranks out of step fall into step.
#include "afd/roles/ffn_gather.h"

#include <gtest/gtest.h>

#include "afd/common/error.h"

namespace afd::roles {
namespace {

TEST(SenderLockstep, LayersAreARing) {
  // Layer 0 dense, MoE layers 1, 2, 4 and 5.
  SenderLockstep s({1, 2, 4, 5}, 2, 1);
  EXPECT_EQ(s.NextMoeLayer(1), 2);
  EXPECT_EQ(s.NextMoeLayer(2), 4);
  EXPECT_EQ(s.NextMoeLayer(5), 1);  // a step's end: the next step's first MoE layer
  EXPECT_EQ(s.Distance(2, 2), 0);
  EXPECT_EQ(s.Distance(2, 5), 2);
  EXPECT_EQ(s.Distance(5, 2), 2);  // across the step's end
  EXPECT_EQ(s.Distance(4, 1), 2);
  EXPECT_TRUE(s.Behind(1, 0, 2, 1));
  EXPECT_FALSE(s.Behind(2, 1, 1, 0)) << "three layers on: ahead";
  EXPECT_FALSE(s.Behind(2, 0, 2, 1)) << "the same layer";
  // Exactly half a step apart: the lower sender is behind, never both.
  EXPECT_TRUE(s.Behind(1, 0, 4, 1));
  EXPECT_FALSE(s.Behind(4, 1, 1, 0));
  EXPECT_FALSE(s.Behind(1, 1, 4, 0));
  EXPECT_THROW(s.Distance(3, 1), Error) << "layer 3 is dense";
}

TEST(SenderLockstep, LagOfASenderToALayer) {
  SenderLockstep s({0, 1, 2, 3, 4, 5}, 3, 2);
  const int f = 24;  // the items' flags
  EXPECT_EQ(s.Lag(1, 0, 0, f, 0), -1) << "nothing served yet: no expectation";
  s.Served(1, 0, 2, f);
  EXPECT_EQ(s.Lag(1, 0, 3, f, 0), 0) << "its next item";
  EXPECT_EQ(s.Lag(1, 0, 5, f, 0), 2) << "behind by two";
  EXPECT_EQ(s.Lag(1, 0, 0, f, 0), -1) << "three of six on: not behind";
  EXPECT_EQ(s.Lag(1, 0, 1, f, 0), -1) << "ahead";
  EXPECT_EQ(s.Lag(1, 0, 3, 8, 0), -1) << "its last item had other flags";
  EXPECT_EQ(s.Lag(1, 1, 3, f, 0), -1) << "another stage";
  EXPECT_EQ(s.Lag(0, 0, 3, f, 1), -1) << "another sender";
  s.Served(1, 0, 5, f);
  EXPECT_EQ(s.Lag(1, 0, 0, f, 0), 0) << "a step's end: the first MoE layer next";
}

TEST(SenderLockstep, AMissedWaitStopsWaitingUntilTheSenderIsServedAgain) {
  SenderLockstep s({0, 1}, 3, 1);
  s.Served(2, 0, 0, 0);
  ASSERT_EQ(s.Lag(2, 0, 1, 0, 0), 0);
  s.Missed(2);
  EXPECT_EQ(s.Lag(2, 0, 1, 0, 0), -1) << "an idle sender costs one wait";
  s.Served(2, 0, 1, 0);
  EXPECT_EQ(s.Lag(2, 0, 0, 0, 0), 0);
}

TEST(SenderLockstep, WaitsFollowTheSendersPace) {
  SenderLockstep s({0, 1, 2, 3}, 2, 1);
  EXPECT_EQ(s.WaitUntil(0, 0, 1000, 200), 1200) << "no gaps seen yet: wait_us";
  EXPECT_EQ(s.WaitUntil(0, 0, 1000, 0), 1000) << "wait_us 0: no waiting";
  s.Arrived(0, 0, 0, 10000);
  s.Arrived(0, 0, 1, 10800);  // gap 800
  EXPECT_EQ(s.WaitUntil(0, 0, 11000, 200), 10800 + 1600 + 200);
  s.Arrived(0, 0, 2, 11200);  // gap 400: average 0.75 * 800 + 0.25 * 400 = 700
  EXPECT_EQ(s.WaitUntil(0, 0, 11300, 200), 11200 + 1400 + 200);
  EXPECT_EQ(s.WaitUntil(0, 0, 20000, 200), 20200) << "at least wait_us from now";
  s.Arrived(0, 0, 0, 90000);  // across a step's end: not a gap
  EXPECT_EQ(s.WaitUntil(0, 0, 90000, 200), 90000 + 1400 + 200);
  s.Arrived(0, 0, 2, 200000);  // not the next layer: not a gap either
  EXPECT_EQ(s.WaitUntil(0, 0, 200000, 200), 200000 + 1400 + 200);
  s.Arrived(1, 0, 0, 0);
  s.Arrived(1, 0, 1, 1000000);  // a slow sender: capped
  EXPECT_EQ(s.WaitUntil(1, 0, 1000000, 200), 1000000 + SenderLockstep::kMaxWaitUs);
  EXPECT_EQ(s.WaitUntil(1, 0, 1000000, 50000), 1000000 + 50000);
}

TEST(SenderLockstep, BadArgumentsAreRefused) {
  EXPECT_THROW(SenderLockstep({}, 1, 1), Error);
  EXPECT_THROW(SenderLockstep({2, 1}, 1, 1), Error);
  EXPECT_THROW(SenderLockstep({1}, 0, 1), Error);
  SenderLockstep s({1}, 1, 1);
  EXPECT_THROW(s.Served(1, 0, 1, 0), Error);
  EXPECT_THROW(s.Arrived(0, 1, 1, 0), Error);
}

}  // namespace
}  // namespace afd::roles

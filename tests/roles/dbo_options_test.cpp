// The DBO rule (roles/dbo_options.h), the one both attention runners and the P2P step's
// shared decision ask.
#include "afd/roles/dbo_options.h"

#include <gtest/gtest.h>

namespace afd::roles {
namespace {

TEST(DboOptions, SplitsAtTheStepKindsThresholdIntoTwoNonEmptyHalves) {
  DboOptions off;
  EXPECT_FALSE(off.Splits(100000, false));
  EXPECT_FALSE(off.Splits(100000, true));
  DboOptions dbo;
  dbo.enabled = true;
  dbo.decode_token_threshold = 32;
  dbo.prefill_token_threshold = 512;
  EXPECT_FALSE(dbo.Splits(31, false));
  EXPECT_TRUE(dbo.Splits(32, false));
  EXPECT_FALSE(dbo.Splits(511, true));  // a step with prompt tokens has the prefill threshold
  EXPECT_TRUE(dbo.Splits(512, true));
  // Thresholds below 2 still need two tokens: both micro-batches have rows.
  dbo.decode_token_threshold = 0;
  dbo.prefill_token_threshold = 1;
  EXPECT_FALSE(dbo.Splits(0, false));
  EXPECT_FALSE(dbo.Splits(1, false));
  EXPECT_FALSE(dbo.Splits(1, true));
  EXPECT_TRUE(dbo.Splits(2, false));
  EXPECT_TRUE(dbo.Splits(2, true));
}

TEST(DboOptions, StagesAreTwoWhereItSplitsOrTheFixedCountAtMostTheTokens) {
  DboOptions dbo;
  dbo.enabled = true;
  EXPECT_EQ(dbo.Stages(31, false), 1);
  EXPECT_EQ(dbo.Stages(32, false), 2);
  EXPECT_EQ(dbo.Stages(511, true), 1);
  // The async connector's async_moe_ubatching: every step, whatever the thresholds (and DBO
  // off), as many micro-batches as asked while each has a token.
  DboOptions fixed;
  fixed.fixed_stages = 3;
  EXPECT_EQ(fixed.Stages(1, false), 1);
  EXPECT_EQ(fixed.Stages(2, true), 2);
  EXPECT_EQ(fixed.Stages(3, false), 3);
  EXPECT_EQ(fixed.Stages(1000, true), 3);
  EXPECT_EQ(fixed.Stages(0, false), 1);
}

}  // namespace
}  // namespace afd::roles

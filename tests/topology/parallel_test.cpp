#include "afd/topology/parallel.h"

#include <gtest/gtest.h>

#include "afd/common/error.h"

namespace afd {
namespace {

TEST(Parallel, LinearizeRoundTrip) {
  for (int dp = 1; dp <= 4; ++dp) {
    for (int pcp = 1; pcp <= 3; ++pcp) {
      for (int tp = 1; tp <= 4; ++tp) {
        const ParallelSizes s{dp, pcp, tp};
        int expected = 0;
        for (int d = 0; d < dp; ++d) {
          for (int p = 0; p < pcp; ++p) {
            for (int t = 0; t < tp; ++t) {
              const ParallelCoords c{d, p, t};
              ASSERT_EQ(LinearizeRoleRank(s, c), expected);  // (d*pcp + p)*tp + t
              ASSERT_EQ(DelinearizeRoleRank(s, expected), c);
              ++expected;
            }
          }
        }
      }
    }
  }
}

TEST(Parallel, RangeChecksNameTheCoordinate) {
  const ParallelSizes s{2, 1, 2};
  try {
    LinearizeRoleRank(s, {0, 0, 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tp_rank 2 is out of range 0..1");
  }
  EXPECT_THROW(LinearizeRoleRank(s, {2, 0, 0}), Error);
  EXPECT_THROW(LinearizeRoleRank(s, {0, 1, 0}), Error);
  EXPECT_THROW(LinearizeRoleRank(s, {-1, 0, 0}), Error);
  EXPECT_THROW(LinearizeRoleRank({0, 1, 1}, {0, 0, 0}), Error);
  EXPECT_THROW(DelinearizeRoleRank(s, 4), Error);
}

TEST(Parallel, RankRule) {
  EXPECT_NO_THROW(CheckRankRule(Role::kAttention, 4, {2, 1, 2}));
  EXPECT_NO_THROW(CheckRankRule(Role::kFfn, 2, {2, 1, 1}));
  try {
    CheckRankRule(Role::kAttention, 3, {2, 1, 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "attention ranks must equal DP x PCP x TP of the attention server: "
                 "num_attention_ranks=3 but DP 2 x PCP 1 x TP 2 = 4");
  }
}

TEST(Parallel, ExpandTokenCounts) {
  // DP2 x TP2: per-DP vector expands to every TP peer.
  EXPECT_EQ(ExpandTokenCounts({5, 7}, 4), (std::vector<int64_t>{5, 5, 7, 7}));
  EXPECT_EQ(ExpandTokenCounts({5, 7, 1, 0}, 4), (std::vector<int64_t>{5, 7, 1, 0}));
  EXPECT_EQ(ExpandTokenCounts({3}, 3), (std::vector<int64_t>{3, 3, 3}));
  EXPECT_THROW(ExpandTokenCounts({1, 2, 3}, 4), Error);
  EXPECT_THROW(ExpandTokenCounts({1, 2, 3, 4, 5}, 4), Error);
  EXPECT_THROW(ExpandTokenCounts({}, 4), Error);
  EXPECT_THROW(ExpandTokenCounts({1, -2}, 4), Error);
}

}  // namespace
}  // namespace afd

#include "afd/topology/expert_range.h"

#include <gtest/gtest.h>

#include "afd/common/error.h"

namespace afd {
namespace {

// Every expert has exactly one owner, ranges are contiguous and ordered, the first E % R ranks
// hold one more, and ExpertOwner agrees with ExpertRangeOf -- for expert counts below, equal to
// and above the rank count.
TEST(ExpertRange, RangesTileTheExpertsAndOwnerAgrees) {
  for (int64_t experts : {0, 1, 2, 5, 7, 8, 64, 160, 256, 257}) {
    for (int ranks : {1, 2, 3, 4, 7, 8, 16, 300}) {
      int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const ExpertRange range = ExpertRangeOf(experts, ranks, r);
        EXPECT_EQ(range.begin, next) << experts << " experts, rank " << r << " of " << ranks;
        EXPECT_EQ(range.size(), experts / ranks + (r < experts % ranks ? 1 : 0));
        for (int64_t e = range.begin; e < range.end; ++e) {
          EXPECT_TRUE(range.contains(e));
          ASSERT_EQ(ExpertOwner(e, experts, ranks), r) << "expert " << e << " of " << experts;
        }
        next = range.end;
      }
      EXPECT_EQ(next, experts);
    }
  }
}

TEST(ExpertRange, ExamplesAndBounds) {
  EXPECT_EQ(ExpertRangeOf(64, 3, 0), (ExpertRange{0, 22}));
  EXPECT_EQ(ExpertRangeOf(64, 3, 1), (ExpertRange{22, 43}));
  EXPECT_EQ(ExpertRangeOf(64, 3, 2), (ExpertRange{43, 64}));
  EXPECT_FALSE(ExpertRangeOf(64, 3, 1).contains(21));
  EXPECT_FALSE(ExpertRangeOf(64, 3, 1).contains(43));
  EXPECT_EQ(ExpertRangeOf(2, 4, 3), (ExpertRange{2, 2}));  // a rank may own none
}

TEST(ExpertRange, BadArgumentsAreRefusedByName) {
  EXPECT_THROW(ExpertRangeOf(-1, 2, 0), Error);
  EXPECT_THROW(ExpertRangeOf(8, 0, 0), Error);
  EXPECT_THROW(ExpertRangeOf(8, 2, 2), Error);
  EXPECT_THROW(ExpertRangeOf(8, 2, -1), Error);
  try {
    ExpertRangeOf(8, 2, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5 is outside [0, 2)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace afd

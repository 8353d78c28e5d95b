// The DBO rule (runtime/dbo_options.h), the one both attention runners and the P2P step's
// shared decision ask.
#include "afd/runtime/dbo_options.h"

#include <gtest/gtest.h>

namespace afd::runtime {
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

}  // namespace
}  // namespace afd::runtime

// Host-side plans of the CUDA backend's kernels (no GPU needed): the MLA decode split counts,
// which shapes the fp32 GEMV, the fused router, the expanded MLA prefill and the permute over
// blocks take.
#include <gtest/gtest.h>

#ifdef AFD_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "afd/kernels/cuda/gemv.cuh"
#include "afd/kernels/cuda/gqa.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/moe.cuh"
#include "afd/kernels/cuda/router.cuh"

namespace afd::kernels::cuda {
namespace {

constexpr int kSms = 132;  // an H200

// Positions per split of the tiled kernel (64-row tiles): whole tiles, every position covered.
int64_t TileSpan(int64_t max_context, int64_t splits) {
  const int64_t tiles = (max_context + 63) / 64;
  return (tiles + splits - 1) / splits * 64;
}

TEST(MlaSplitsTiles, CoverTheContextWithinLimits) {
  for (int64_t n : {1, 3, 16, 64, 133, 256, 8192}) {
    for (int64_t nh : {16, 20, 128}) {
      for (int64_t ctx : {1, 64, 65, 192, 1024, 4096, 163840}) {
        const int64_t s = MlaSplits(n, nh, ctx, /*tiles=*/true, kSms);
        ASSERT_GE(s, 1) << n << " " << nh << " " << ctx;
        ASSERT_LE(s, 64) << n << " " << nh << " " << ctx;  // kMaxMlaSplits
        // No split past the context is wasted: the last split starts inside it.
        EXPECT_LT((s - 1) * TileSpan(ctx, s), std::max<int64_t>(ctx, 1))
            << n << " tokens, " << nh << " heads, context " << ctx << ": " << s << " splits";
        EXPECT_GE(s * TileSpan(ctx, s), ctx);
      }
    }
  }
}

TEST(MlaSplitsTiles, FewTokensSpreadLongContextsManyTokensDoNot) {
  // One token over 1024 positions (16 tiles): 8 splits of 2 tiles; 16 splits of one would
  // spend more on their merge than they save.
  EXPECT_EQ(MlaSplits(1, 16, 1024, true, kSms), 8);
  // Short contexts: a merge costs more than walking 3 or 4 tiles in one block; 8 tiles in 4.
  EXPECT_EQ(MlaSplits(1, 16, 129, true, kSms), 1);
  EXPECT_EQ(MlaSplits(1, 16, 256, true, kSms), 1);
  EXPECT_EQ(MlaSplits(1, 16, 512, true, kSms), 4);
  // 16 tokens: 8 splits of 2 tiles (128 blocks, one wave) cost less than 16 of 1 (two waves).
  EXPECT_EQ(MlaSplits(16, 16, 1024, true, kSms), 8);
  // More (token, group) blocks than SMs: one split, each block walks its whole context.
  EXPECT_EQ(MlaSplits(256, 16, 1024, true, kSms), 1);
  EXPECT_EQ(MlaSplits(8192, 16, 1024, true, kSms), 1);
}

// A forced count (Backend::FormOverrides: bench flags) is taken, but never past one split per
// tile or chunk, nor past 64.
TEST(MlaSplitsForced, TakenWithinTheTilesOrChunks) {
  EXPECT_EQ(MlaSplits(1, 16, 1024, true, kSms, 3), 3);
  EXPECT_EQ(MlaSplits(256, 16, 1024, true, kSms, 4), 4);  // where the choice would be 1
  EXPECT_EQ(MlaSplits(1, 16, 100, true, kSms, 8), 2);     // two 64-row tiles
  EXPECT_EQ(MlaSplits(1, 16, 100, false, kSms, 64), 7);   // seven 16-row chunks
  EXPECT_EQ(MlaSplits(1, 16, 100000, false, kSms, 64), 64);
}

TEST(MlaSplitsChunks, AtMostTheChunksAndSixtyFour) {
  EXPECT_EQ(MlaSplits(1, 16, 16, false, kSms), 1);  // one 16-row chunk
  EXPECT_EQ(MlaSplits(1, 16, 100000, false, kSms), 64);
  EXPECT_EQ(MlaSplits(512, 16, 1024, false, kSms), 1);
}

// The fp32 GEMV's reach: any column count up to 8 rows; 9-16 rows in chunks only for the router
// gate's few columns (<= 256); K a multiple of 4 (16-byte loads). Above: cuBLAS / the skinny
// kernel.
TEST(GemvF32, TakesFewRowsAndTheRouterGateUpToSixteen) {
  EXPECT_TRUE(GemvF32Fits(1, 2048, 64));
  EXPECT_TRUE(GemvF32Fits(8, 2048, 3072));
  EXPECT_TRUE(GemvF32Fits(16, 2048, 64));
  EXPECT_TRUE(GemvF32Fits(9, 4096, 256));
  EXPECT_FALSE(GemvF32Fits(9, 2048, 257));
  EXPECT_FALSE(GemvF32Fits(17, 2048, 64));
  EXPECT_FALSE(GemvF32Fits(4, 2046, 64));
  EXPECT_FALSE(GemvF32Fits(0, 2048, 64));
}

// The fused router: up to 8 tokens, K % 4, the router kernel's expert, group and top-k limits.
TEST(RouterGateTopk, FusedForAFewTokens) {
  const RouterArgs v2{false, false, 6, 1, 1, false, 0.0f, 1.0f},
      v3{true, true, 8, 8, 4, true, 1e-20f, 2.5f};
  EXPECT_TRUE(RouterGateTopkFits(1, 2048, 64, v2));
  EXPECT_TRUE(RouterGateTopkFits(8, 7168, 256, v3));
  EXPECT_FALSE(RouterGateTopkFits(9, 2048, 64, v2));
  EXPECT_FALSE(RouterGateTopkFits(1, 2050, 64, v2));
  EXPECT_FALSE(RouterGateTopkFits(1, 2048, kMaxRouterExperts + 1, v2));
  // From 65 tokens, the row-blocked form up to kMaxRouterRowsTokens (9-64 tokens and prefill
  // chunks of 512+ take the GEMV / GEMM, then the router).
  EXPECT_FALSE(RouterRowsFits(64, 2048, 64, v2));
  EXPECT_TRUE(RouterRowsFits(65, 2048, 64, v2));
  EXPECT_TRUE(RouterRowsFits(kMaxRouterRowsTokens, 7168, 256, v3));
  EXPECT_FALSE(RouterRowsFits(kMaxRouterRowsTokens + 1, 2048, 64, v2));
  EXPECT_FALSE(RouterRowsFits(100, 2050, 64, v2));
  EXPECT_FALSE(RouterRowsFits(100, 2048, kMaxRouterExperts + 1, v2));
}

// The expanded MLA prefill: DeepSeek's head dims only, a step of 256+ tokens, two or more a
// sequence, whose context rows (sequences x max_context) are at most 4 per token, decompressed
// rows under 2 GiB.
TEST(MlaPrefillFits, MostlyNewTokensOfDeepseekHeads) {
  EXPECT_TRUE(MlaPrefillFits(8192, 8, 1024, 128, 64, 128, 512, 16));    // 8 x 1024 prompts
  EXPECT_TRUE(MlaPrefillFits(32768, 256, 128, 128, 64, 128, 512, 16));  // 256 x 128
  EXPECT_TRUE(MlaPrefillFits(300, 3, 400, 128, 64, 128, 512, 16));      // a cached prefix
  EXPECT_FALSE(MlaPrefillFits(255, 1, 255, 128, 64, 128, 512, 16));     // too few tokens
  EXPECT_FALSE(MlaPrefillFits(256, 256, 1025, 128, 64, 128, 512, 16));  // decode: one a sequence
  EXPECT_FALSE(MlaPrefillFits(512, 512, 2, 128, 64, 128, 512, 16));     // even at short contexts
  EXPECT_FALSE(MlaPrefillFits(8192, 8, 1024, 64, 64, 128, 512, 16));    // other head dims
  EXPECT_FALSE(MlaPrefillFits(8192, 8, 1024, 128, 32, 128, 512, 16));
  EXPECT_FALSE(MlaPrefillFits(8192, 8, 1024, 128, 64, 64, 512, 16));
  EXPECT_FALSE(MlaPrefillFits(8192, 8, 1024, 128, 64, 128, 500, 16));  // kvr not 8-aligned
  // 262144 rows x (16 x 256 + 576) bf16 is over 2 GiB: the absorbed form.
  EXPECT_FALSE(MlaPrefillFits(262144, 256, 1024, 128, 64, 128, 512, 16));
}

// MoePermute's counts scratch: none (one block) at decode sizes and past 128 local experts,
// blocks x experts ints from 8 tiles of 1024 slots on.
TEST(MoePermuteScratch, BlocksOnlyForManySlots) {
  EXPECT_EQ(MoePermuteScratchInts(256, 6, 64), 0);        // decode batch 256: 1536 slots
  EXPECT_EQ(MoePermuteScratchInts(1194, 6, 64), 0);       // 7164 slots: 7 tiles
  EXPECT_EQ(MoePermuteScratchInts(1195, 6, 64), 8 * 64);  // 7170 slots: 8 tiles
  EXPECT_EQ(MoePermuteScratchInts(8192, 6, 64), 48 * 64);
  EXPECT_EQ(MoePermuteScratchInts(8192, 8, 160), 0);  // over 128 local experts
}

// A forced form from the environment: unset or empty is 0 (the launcher's own choice), 1..max
// taken, anything else refused with the variable's name.
TEST(ChoiceCount, TakesOneToMaxAndRefusesTheRest) {
  constexpr const char* kName = "AFD_MLA_WG";  // a registered count (1: the form wherever it runs)
  unsetenv(kName);
  EXPECT_EQ(ChoiceCount(kName, 2), 0);
  for (const auto& [v, want] :
       std::vector<std::pair<const char*, int64_t>>{{"", 0}, {"1", 1}, {"2", 2}}) {
    setenv(kName, v, 1);
    EXPECT_EQ(ChoiceCount(kName, 2), want) << v;
  }
  for (const char* bad : {"0", "3", "-1", "2x", "two"}) {
    setenv(kName, bad, 1);
    try {
      ChoiceCount(kName, 2);
      ADD_FAILURE() << bad << " was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(kName), std::string::npos) << e.what();
    }
  }
  unsetenv(kName);
}

}  // namespace
}  // namespace afd::kernels::cuda

#endif  // AFD_WITH_CUDA

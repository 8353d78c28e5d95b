// The MoE router: top-k, the fused gate + top-k forms, the fused router + permute (router.cu).
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// router.cu: one warp per token; num_experts <= kMaxRouterExperts.
inline constexpr int kMaxRouterExperts = 512;
struct RouterArgs {
  bool sigmoid;
  bool group_limited;
  int64_t top_k, n_group, topk_group;
  bool norm_topk_prob;
  float norm_eps;
  float scaling;
};
void LaunchRouterTopk(const float* logits, int64_t n, int64_t num_experts, const float* bias,
                      const RouterArgs& args, int32_t* ids, float* weights, cudaStream_t s);
// The router gate (fp32 GEMV, LaunchGemvF32's arithmetic) and the top-k in one launch, for up
// to 8 tokens: logits [n, num_experts] written on the way; counter: one zeroed unsigned int the
// kernel leaves zeroed. permute.offsets non-null (RouterPermuteFits): the routed slots are also
// grouped over local experts [begin, begin + local) exactly as LaunchMoePermute groups them.
struct PermuteArgs {
  int64_t begin = 0;
  int local = 0;
  int32_t* offsets = nullptr;      // [local + 1]
  int32_t* src_row = nullptr;      // [n·k]
  int32_t* row_of_slot = nullptr;  // [n, k]
};
bool RouterGateTopkFits(int64_t n, int64_t k, int64_t num_experts, const RouterArgs& args);
// The router gate and the top-k in one launch for kMinRouterRowsTokens .. kMaxRouterRowsTokens
// tokens (decode batch 65+, prefill chunks under 512): blocks of 8 tokens x 8 experts, every
// logit summed in one fixed order whatever the batch (not GemvF32's nor cuBLAS's: a token's
// logits may differ in the last bits between batches on either side of a bound). counters:
// RouterRowsCounters(n) zeroed unsigned ints the kernel leaves zeroed. Not below 65 tokens: at
// decode batch 16-64 the step measured as fast or faster without it (batch 64: 12.26 vs 10.14
// ms: the MoE block's router and grouping took 21 us instead of 42, but the routed experts'
// kernels then ran ~35% slower, presumably beside the shared experts' GEMMs still on the side
// stream; kernel trace, twentieth session); at 128 it saves 0.2 ms.
inline constexpr int64_t kMinRouterRowsTokens = 65, kMaxRouterRowsTokens = 511;
bool RouterRowsFits(int64_t n, int64_t k, int64_t num_experts, const RouterArgs& args);
int64_t RouterRowsCounters(int64_t n);
void LaunchRouterRows(const float* x, int64_t n, int64_t k, const float* w, int64_t num_experts,
                      float* logits, const float* bias, const RouterArgs& args, int32_t* ids,
                      float* weights, unsigned int* counters, cudaStream_t s);
bool RouterPermuteFits(int64_t n, const RouterArgs& args, int64_t num_local);
void LaunchRouterGateTopk(const float* x, int64_t n, int64_t k, const float* w, int64_t num_experts,
                          float* logits, const float* bias, const RouterArgs& args, int32_t* ids,
                          float* weights, const PermuteArgs& permute, unsigned int* counter,
                          cudaStream_t s);

}  // namespace afd::kernels::cuda

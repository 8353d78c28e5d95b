// GQA over the paged key/value cache (gqa.cu): the fused q/k norm + rope + cache write, decode and
// prefill attention.
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "afd/kernels/cuda/attention_args.cuh"

namespace afd::kernels::cuda {

// gqa.cu: GQA over the paged key/value cache (kernels/backend.h GqaCacheWrite, GqaAttention);
// head_dim <= kGqaMaxHeadDim.
inline constexpr int64_t kGqaMaxHeadDim = 256;
void LaunchGqaCacheWrite(const float* qkv, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                         const float* q_norm, const float* k_norm, float eps, const PagedArgs& t,
                         const RopeArgs& rope, float* q, void* cache, bool bf16_cache,
                         cudaStream_t s);
// Which kernel runs. tensor_cores: the bf16 tensor-core form (q and P rounded to bf16, as a
// bf16 model's tensors; fp32 accumulation), for a bf16 model (tf32: Backend::AllowTf32) with a
// bf16 cache and head_dim 64, 128 or 256; otherwise the fp32 CUDA-core kernels (exact up to
// summation order). pairs: with tensor cores, two consecutive tokens of one sequence share a
// block's tile (and the sequence's k / v rows): chosen for steps of >= 2 tokens a sequence
// (prefill; seqs: the block tables' rows), head_dim <= 128.
struct GqaForm {
  bool tensor_cores = false;
  bool pairs = false;
};
GqaForm GqaChooseForm(int64_t d, bool bf16_cache, bool tf32, int64_t n, int64_t seqs);
// Context splits for n tokens over heads [h0, h1) of a max_context-long context (fixed in a
// captured graph; each token's own length is split the same way on the device).
int64_t GqaSplits(int64_t n, int64_t heads, int64_t kvh, int64_t h0, int64_t h1,
                  int64_t max_context, const GqaForm& form, int sm_count);
int64_t GqaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t d);
// partial: GqaPartialFloats(...) floats of device scratch (unused for one split).
void LaunchGqaAttention(const float* q, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                        const PagedArgs& t, const void* cache, bool bf16_cache, int64_t h0,
                        int64_t h1, float scale, int64_t splits, const GqaForm& form,
                        float* partial, float* out, cudaStream_t s);

}  // namespace afd::kernels::cuda

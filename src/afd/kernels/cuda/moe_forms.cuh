// The forms of the grouped expert GEMMs, one family per file, chosen by shape in moe.cu
// (LaunchGroupedLinear, LaunchGroupedMlpMma). Every form computes, for each local expert e, the
// rows [offsets[e], offsets[e + 1]) of x (device counts: no host sync, grids sized from the
// host-known m and num_local, so every launch is graph-safe) against its weights w_ptrs[e]:
// [N, K] row-major, bf16 (or fp32 where the form says so); with swiglu, [2N', K] gate | up and
// y[r, c] = silu(gate_c) · up_c for c < N' = n_out. Outputs [m, n_out]; x and y never alias. All
// on stream s, programmatic dependent launch where the step allows it (pdl.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// Above this many rows per expert on average the mma.sync form yields to the tiled one.
inline constexpr int64_t kMmaMaxAvgRows = 256;

// moe_mma.cu -- mma.sync m16n8k16 from bf16 x (already rounded), up to kMmaMaxAvgRows rows per
// expert on average (any_rows: any number; FP8 experts, which the tiled form does not read):
// K a multiple of 32, N of 8. Into fp32 y, or (swiglu only) bf16 yb. Weights bf16.
// LaunchGroupedMmaFp8: the FP8 experts' form (sm_89+), m16n8k32 e4m3 from E4M3 x codes xq [m, k]
// with x_scales [m, ceil(k / 128)] (LaunchRowsToFp8) against E4M3 weights with each expert's
// float32 scales per 128 x 128 block (s_ptrs; kernels::ExpertWeights' layout); into fp32 y.
bool MmaFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local, bool any_rows = false);
void LaunchGroupedMma(const __nv_bfloat16* x, int64_t m, int64_t k, const void* const* w_ptrs,
                      const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                      bool bf16_out, float* y, __nv_bfloat16* yb, cudaStream_t s);
void LaunchGroupedMmaFp8(const uint8_t* xq, const float* x_scales, int64_t m, int64_t k,
                         const void* const* w_ptrs, const void* const* s_ptrs,
                         const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                         float* y, cudaStream_t s);

// moe_tiled.cu -- a tiled tensor-core GEMM (wgmma on sm_90a, else mma.sync) from bf16 x, above
// kMmaMaxAvgRows rows per expert: K a multiple of 8, N even. SwiGLU into bf16 yb, the plain
// projection into fp32 y.
bool TiledFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local);
void LaunchGroupedTiled(const __nv_bfloat16* x, int64_t m, int64_t k, const void* const* w_ptrs,
                        const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                        bool bf16_out, float* y, __nv_bfloat16* yb, cudaStream_t s);

// moe_wmma.cu -- WMMA 16x16x16 from fp32 x (rounded to bf16 while staged), 16+ rows per expert
// on average, K and N multiples of 16; into fp32 y.
bool WmmaFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local);
void LaunchGroupedWmma(const float* x, int64_t m, int64_t k, const void* const* w_ptrs,
                       const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                       float* y, cudaStream_t s);

// moe_gemv.cu -- CUDA cores, into fp32 y. Decode sizes (K a multiple of 8): a warp per output
// column from fp32 x (bf16 or fp32 weights), or 4 weight rows per warp from bf16 xb (bf16
// weights); any size: the SIMT tiled fallback (fp32 x, bf16 or fp32 weights).
void LaunchGroupedGemvBf16(const __nv_bfloat16* xb, int64_t k, const void* const* w_ptrs,
                           const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                           float* y, cudaStream_t s);
void LaunchGroupedGemv(const float* x, int64_t k, const void* const* w_ptrs, bool bf16,
                       const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                       float* y, cudaStream_t s);
void LaunchGroupedSimt(const float* x, int64_t m, int64_t k, const void* const* w_ptrs, bool bf16,
                       const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                       float* y, cudaStream_t s);

// moe.cu -- x [n] (or the rows x[index[r]] of width h) rounded to bf16 into xb.
void LaunchRowsToBf16(const float* x, int64_t n, __nv_bfloat16* xb, cudaStream_t s);
void LaunchGatherRowsToBf16(const float* x, const int32_t* index, int64_t m, int64_t h,
                            __nv_bfloat16* xb, cudaStream_t s);
// moe.cu -- m rows of x [*, h] (index: null, or row r is x[index[r]]) as E4M3 codes q [m, h]
// with float32 scales [m, ceil(h / 128)], per group of 128 by the AFD dispatch's rules
// (common/fp8_rows.h); h % 4 == 0.
void LaunchRowsToFp8(const float* x, const int32_t* index, int64_t m, int64_t h, uint8_t* q,
                     float* scales, cudaStream_t s);

}  // namespace afd::kernels::cuda

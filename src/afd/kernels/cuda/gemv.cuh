// Few-row Linear forms: the bf16 and fp32 GEMVs, the skinny fp32 tiles (gemv.cu).
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// gemv.cu: y[n, N] = x[n, K] · wᵀ for n <= kMaxGemvRows rows (K % 8 == 0), x f32 (rounded to
// bf16 as it is read; 16-byte aligned), w bf16 [N, K], y f32.
inline constexpr int kMaxGemvRows = 8;
bool GemvFits(int64_t n, int64_t k);
void LaunchGemvBf16(const float* x, int64_t n, int64_t k, const void* w, int64_t m, float* y,
                    cudaStream_t s);
// fp32 Linear of many rows (512+) and few columns (<= 256: the router gate at prefill), 64 x 64
// tiles on the CUDA cores (fp32 exact, one summation order).
bool SkinnyF32Fits(int64_t n, int64_t k, int64_t m);
void LaunchSkinnyF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y,
                     cudaStream_t s);
// The GEMV with fp32 x and w (K % 4 == 0; x and w 16-byte aligned): up to kMaxGemvRows rows, or
// up to kMaxGemvF32Rows (in chunks of kMaxGemvRows, one launch) of at most
// kMaxGemvF32ChunkedCols columns (the router gate at decode batch 9-16).
inline constexpr int64_t kMaxGemvF32Rows = 16, kMaxGemvF32ChunkedCols = 256;
bool GemvF32Fits(int64_t n, int64_t k, int64_t m);
void LaunchGemvF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y,
                   cudaStream_t s);

}  // namespace afd::kernels::cuda

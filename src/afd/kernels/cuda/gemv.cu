// Linear for a few rows (decode at small batch) with bf16 weights: y[n, N] = x[n, K] · wᵀ, one
// warp per output column streaming that weight row once with 16-byte loads, the n <= 8 rows of
// x (already rounded to bf16, as the cuBLAS path does) from L1/L2, fp32 accumulation. cuBLAS
// picks GEMM kernels that read these shapes at 0.4-0.6 TB/s; this reads near the copy rate.
#include <cuda_bf16.h>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/bf16_vec.cuh"
#include "afd/kernels/cuda/launch.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kWarps = 8;

template <int kRowsMax>
__global__ void __launch_bounds__(kWarps * 32)
    GemvBf16(const __nv_bfloat16* x, int rows, int64_t k, const __nv_bfloat16* w, int64_t m,
             float* y) {
  const int lane = threadIdx.x & 31;
  const int64_t c = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (c >= m) return;
  const __nv_bfloat16* wc = w + c * k;
  float acc[kRowsMax] = {};
  int64_t k0 = int64_t(lane) * 8;
  // Two weight loads in flight per lane per iteration.
  for (; k0 + 32 * 8 < k; k0 += 2 * 32 * 8) {
    const uint4 wa = *reinterpret_cast<const uint4*>(wc + k0);
    const uint4 wb = *reinterpret_cast<const uint4*>(wc + k0 + 32 * 8);
    float fa[8], fb[8];
    Unpack8Bf16(wa, fa);
    Unpack8Bf16(wb, fb);
#pragma unroll
    for (int r = 0; r < kRowsMax; ++r) {
      if (r >= rows) break;
      float xa[8], xb[8];
      Unpack8Bf16(*reinterpret_cast<const uint4*>(x + r * k + k0), xa);
      Unpack8Bf16(*reinterpret_cast<const uint4*>(x + r * k + k0 + 32 * 8), xb);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[r] += fa[i] * xa[i] + fb[i] * xb[i];
    }
  }
  for (; k0 < k; k0 += 32 * 8) {
    float fa[8];
    Unpack8Bf16(*reinterpret_cast<const uint4*>(wc + k0), fa);
#pragma unroll
    for (int r = 0; r < kRowsMax; ++r) {
      if (r >= rows) break;
      float xa[8];
      Unpack8Bf16(*reinterpret_cast<const uint4*>(x + r * k + k0), xa);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[r] += fa[i] * xa[i];
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsMax; ++r) {
    if (r >= rows) break;
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[r * m + c] = v;
  }
}

}  // namespace

bool GemvFits(int64_t n, int64_t k) { return n >= 1 && n <= kMaxGemvRows && k % 8 == 0; }

void LaunchGemvBf16(const uint16_t* x_bf16, int64_t n, int64_t k, const void* w, int64_t m,
                    float* y, cudaStream_t s) {
  AFD_CHECK(GemvFits(n, k), "GemvBf16: {} rows of K = {}", n, k);
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(x_bf16);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
  const int rows = static_cast<int>(n);
  if (n <= 1) {
    GemvBf16<1><<<blocks, kWarps * 32, 0, s>>>(x, rows, k, wb, m, y);
  } else if (n <= 4) {
    GemvBf16<4><<<blocks, kWarps * 32, 0, s>>>(x, rows, k, wb, m, y);
  } else {
    GemvBf16<kMaxGemvRows><<<blocks, kWarps * 32, 0, s>>>(x, rows, k, wb, m, y);
  }
  CheckLaunch("Linear (gemv)");
}

}  // namespace afd::kernels::cuda

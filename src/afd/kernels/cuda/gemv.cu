// Linear for a few rows (decode at small batch): y[n, N] = x[n, K] · wᵀ, one warp per output
// column streaming that weight row once with 16-byte loads, the n <= 8 rows of x from L1/L2,
// fp32 accumulation. bf16 weights: x (fp32) rounded to bf16 as it is read, as the cuBLAS path
// rounds it before its GEMM; fp32 weights: x as is. cuBLAS picks GEMM kernels that read these
// shapes at 0.4-0.6 TB/s (and take ~50 us for the 1x2048x64 router gate); these read near the
// copy rate.
#include <cuda_bf16.h>

#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/bf16_vec.cuh"
#include "afd/kernels/cuda/launch.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kWarps = 8;

// The 8 floats of x at p (16-byte aligned), each rounded to bf16 (as LaunchToBf16 does before a
// cuBLAS bf16 GEMM: the same products either way).
__device__ __forceinline__ void Load8RoundedBf16(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
}

// The end of a one-warp-per-column GEMV: each lane's partial sums of the rows, added over the
// warp in a fixed order, stored by lane 0 into column `y` (row stride m).
template <int kRowsMax>
__device__ __forceinline__ void StoreWarpSums(const float (&acc)[kRowsMax], int rows, int lane,
                                              float* y, int64_t m) {
#pragma unroll
  for (int r = 0; r < kRowsMax; ++r) {
    if (r >= rows) break;
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[r * m] = v;
  }
}

template <int kRowsMax>
__global__ void __launch_bounds__(kWarps * 32)
    GemvBf16(const float* x, int rows, int64_t k, const __nv_bfloat16* w, int64_t m, float* y) {
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
      Load8RoundedBf16(x + r * k + k0, xa);
      Load8RoundedBf16(x + r * k + k0 + 32 * 8, xb);
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
      Load8RoundedBf16(x + r * k + k0, xa);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[r] += fa[i] * xa[i];
    }
  }
  StoreWarpSums<kRowsMax>(acc, rows, lane, y + c, m);
}

// The fp32-weight form (the router gate, and every Linear with --dtype fp32): one warp per output
// column, 16-byte loads of the weight row, the rows of x (fp32) from L1/L2.
template <int kRowsMax>
__global__ void __launch_bounds__(kWarps * 32)
    GemvF32(const float* x, int rows, int64_t k, const float* w, int64_t m, float* y) {
  const int lane = threadIdx.x & 31;
  const int64_t c = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (c >= m) return;
  const float* wc = w + c * k;
  float acc[kRowsMax] = {};
  for (int64_t k0 = int64_t(lane) * 4; k0 < k; k0 += 32 * 4) {
    const float4 wv = *reinterpret_cast<const float4*>(wc + k0);
#pragma unroll
    for (int r = 0; r < kRowsMax; ++r) {
      if (r >= rows) break;
      const float4 xv = *reinterpret_cast<const float4*>(x + r * k + k0);
      acc[r] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
    }
  }
  StoreWarpSums<kRowsMax>(acc, rows, lane, y + c, m);
}

}  // namespace

// Calls launch(std::integral_constant<int, R>{}) with the smallest row bound R (1, 4 or
// kMaxGemvRows) that holds n rows: the kernels keep one accumulator per row in registers.
template <typename Launch>
void ByRowBound(int64_t n, Launch launch) {
  if (n <= 1) {
    launch(std::integral_constant<int, 1>{});
  } else if (n <= 4) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, kMaxGemvRows>{});
  }
}

bool GemvF32Fits(int64_t n, int64_t k) { return n >= 1 && n <= kMaxGemvRows && k % 4 == 0; }

void LaunchGemvF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y,
                   cudaStream_t s) {
  AFD_CHECK(GemvF32Fits(n, k), "GemvF32: {} rows of K = {}", n, k);
  const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
  ByRowBound(n, [&](auto bound) {
    GemvF32<decltype(bound)::value>
        <<<blocks, kWarps * 32, 0, s>>>(x, static_cast<int>(n), k, w, m, y);
  });
  CheckLaunch("Linear (gemv f32)");
}

bool GemvFits(int64_t n, int64_t k) { return n >= 1 && n <= kMaxGemvRows && k % 8 == 0; }

void LaunchGemvBf16(const float* x, int64_t n, int64_t k, const void* w, int64_t m, float* y,
                    cudaStream_t s) {
  AFD_CHECK(GemvFits(n, k), "GemvBf16: {} rows of K = {}", n, k);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
  ByRowBound(n, [&](auto bound) {
    GemvBf16<decltype(bound)::value>
        <<<blocks, kWarps * 32, 0, s>>>(x, static_cast<int>(n), k, wb, m, y);
  });
  CheckLaunch("Linear (gemv)");
}

}  // namespace afd::kernels::cuda

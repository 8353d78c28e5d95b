// The grouped expert GEMMs on CUDA cores (moe_forms.cuh): a per-column GEMV for decode sizes
// (fp32 or bf16 weights; bf16 x too), and the SIMT tiled fallback for everything else.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/bf16_vec.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/moe.cuh"
#include "afd/kernels/cuda/moe_forms.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kTm = 32, kTn = 64, kTk = 32, kThreads = 256;

template <bool kBf16>
__device__ float LoadW(const void* w, int64_t idx) {
  if constexpr (kBf16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[idx]);
  } else {
    return static_cast<const float*>(w)[idx];
  }
}

// grid: (ceil(n_out / kTn), ceil(m / kTm), num_local). Block (e, row tile, col tile) computes
// y[r, c] for rows r of expert e in the tile; blocks past the expert's rows exit at once.
template <bool kBf16, bool kSwiglu>
__global__ void GroupedLinear(const float* x, int64_t k, const void* const* w_ptrs,
                              const int32_t* offsets, int64_t n_out, float* y) {
  PdlStart();
  const int64_t e = blockIdx.z;
  const int64_t r0 = offsets[e] + int64_t(blockIdx.y) * kTm, r_end = offsets[e + 1];
  if (r0 >= r_end) return;
  const void* w = w_ptrs[e];
  const int64_t c0 = int64_t(blockIdx.x) * kTn;
  __shared__ float xs[kTm][kTk + 1];
  __shared__ float ws[kSwiglu ? 2 : 1][kTn][kTk + 1];
  // Each thread: 8 outputs (rows ty + 4i?), layout: 256 threads = 8 rows x 32 cols groups.
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;  // cols tx, tx+32; rows ty + 8j
  float acc[2][4][2] = {};                                 // [gate|up][row j][col i]
  for (int64_t k0 = 0; k0 < k; k0 += kTk) {
    for (int idx = threadIdx.x; idx < kTm * kTk; idx += kThreads) {
      const int rr = idx / kTk, kk = idx % kTk;
      const int64_t r = r0 + rr, kg = k0 + kk;
      xs[rr][kk] = (r < r_end && kg < k) ? x[r * k + kg] : 0.0f;
    }
    for (int g = 0; g < (kSwiglu ? 2 : 1); ++g) {
      for (int idx = threadIdx.x; idx < kTn * kTk; idx += kThreads) {
        const int cc = idx / kTk, kk = idx % kTk;
        const int64_t c = c0 + cc, kg = k0 + kk;
        ws[g][cc][kk] = (c < n_out && kg < k) ? LoadW<kBf16>(w, (c + g * n_out) * k + kg) : 0.0f;
      }
    }
    __syncthreads();
    for (int kk = 0; kk < kTk; ++kk) {
      for (int j = 0; j < 4; ++j) {
        const float a = xs[ty + 8 * j][kk];
        for (int i = 0; i < 2; ++i) {
          acc[0][j][i] += a * ws[0][tx + 32 * i][kk];
          if (kSwiglu) acc[1][j][i] += a * ws[kSwiglu ? 1 : 0][tx + 32 * i][kk];
        }
      }
    }
    __syncthreads();
  }
  for (int j = 0; j < 4; ++j) {
    const int64_t r = r0 + ty + 8 * j;
    if (r >= r_end) continue;
    for (int i = 0; i < 2; ++i) {
      const int64_t c = c0 + tx + 32 * i;
      if (c >= n_out) continue;
      if (kSwiglu) {
        const float g = acc[0][j][i], u = acc[1][j][i];
        y[r * n_out + c] = g / (1.0f + expf(-g)) * u;
      } else {
        y[r * n_out + c] = acc[0][j][i];
      }
    }
  }
}

// Small-M path (decode): one warp per output column, 16-byte weight loads along K, the rows
// of the column's expert (in chunks of kGemvRows) accumulated in registers; x rows come from
// L1/L2 (every warp of the expert reads the same few rows). Reads each used expert's weights
// once at close to the copy rate. grid: (ceil(n_out / warps), 1, num_local).
constexpr int kGemvRows = 8, kGemvWarps = 8;

template <bool kBf16>
__device__ void Load8(const void* w, int64_t idx, float* out) {
  if constexpr (kBf16) {
    Unpack8Bf16(*reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(w) + idx), out);
  } else {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + idx);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + idx + 4);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  }
}

template <bool kBf16, bool kSwiglu>
__global__ void GroupedGemv(const float* x, int64_t k, const void* const* w_ptrs,
                            const int32_t* offsets, int64_t n_out, float* y) {
  PdlStart();
  const int64_t e = blockIdx.z, r_begin = offsets[e], r_end = offsets[e + 1];
  if (r_begin >= r_end) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * kGemvWarps + warp;
  if (c >= n_out) return;
  const void* w = w_ptrs[e];
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kGemvRows) {
    const int rows = static_cast<int>(min(static_cast<int64_t>(kGemvRows), r_end - r0));
    float acc[2][kGemvRows] = {};
    for (int64_t k0 = lane * 8; k0 < k; k0 += 32 * 8) {
      float wv[2][8];
      Load8<kBf16>(w, c * k + k0, wv[0]);
      if (kSwiglu) Load8<kBf16>(w, (c + n_out) * k + k0, wv[1]);
      for (int r = 0; r < kGemvRows; ++r) {
        if (r >= rows) break;
        const float4 xa = *reinterpret_cast<const float4*>(x + (r0 + r) * k + k0);
        const float4 xb = *reinterpret_cast<const float4*>(x + (r0 + r) * k + k0 + 4);
        const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        for (int i = 0; i < 8; ++i) {
          acc[0][r] += xv[i] * wv[0][i];
          if (kSwiglu) acc[1][r] += xv[i] * wv[1][i];
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      float g = acc[0][r], u = kSwiglu ? acc[1][r] : 0.0f;
      for (int o = 16; o > 0; o >>= 1) {
        g += __shfl_xor_sync(0xffffffffu, g, o);
        if (kSwiglu) u += __shfl_xor_sync(0xffffffffu, u, o);
      }
      if (lane == 0) y[(r0 + r) * n_out + c] = kSwiglu ? g / (1.0f + expf(-g)) * u : g;
    }
  }
}

// Small-M path for bf16 experts: x already rounded to bf16 (as the tensor-core path and the
// dense GEMMs do, so a row's result does not depend on which path its batch takes). Each warp
// holds 4 weight rows (SwiGLU: gate and up of 2 columns; else 4 columns) with 4 16-byte loads
// in flight per lane, and each 16-byte x load serves all 4: a quarter of the x traffic of the
// per-column kernel above, which is what bound it at 6+ rows per expert.
constexpr int kWRows = 4;

template <bool kSwiglu>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GroupedGemvBf16(const __nv_bfloat16* x, int64_t k, const void* const* w_ptrs,
                    const int32_t* offsets, int64_t n_out, float* y) {
  PdlStart();
  constexpr int kCols = kSwiglu ? kWRows / 2 : kWRows;
  const int64_t e = blockIdx.z, r_begin = offsets[e], r_end = offsets[e + 1];
  if (r_begin >= r_end) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = (int64_t(blockIdx.x) * kGemvWarps + warp) * kCols;
  if (c0 >= n_out) return;
  const auto* w = static_cast<const __nv_bfloat16*>(w_ptrs[e]);
  // Weight row of slot i: column c0 + i (SwiGLU: gate c0 + i % 2, up n_out + c0 + i % 2).
  const __nv_bfloat16* wr[kWRows];
  bool ok[kWRows];
#pragma unroll
  for (int i = 0; i < kWRows; ++i) {
    const int64_t c = c0 + (kSwiglu ? i % 2 : i);
    ok[i] = c < n_out;
    wr[i] = w + ((kSwiglu && i >= 2 ? n_out : 0) + (ok[i] ? c : c0)) * k;
  }
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kGemvRows) {
    const int rows = static_cast<int>(min(static_cast<int64_t>(kGemvRows), r_end - r0));
    float acc[kWRows][kGemvRows] = {};
    for (int64_t k0 = lane * 8; k0 < k; k0 += 32 * 8) {
      float wv[kWRows][8];
#pragma unroll
      for (int i = 0; i < kWRows; ++i) {
        Unpack8Bf16(*reinterpret_cast<const uint4*>(wr[i] + k0), wv[i]);
      }
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r >= rows) break;
        float xv[8];
        Unpack8Bf16(*reinterpret_cast<const uint4*>(x + (r0 + r) * k + k0), xv);
#pragma unroll
        for (int i = 0; i < kWRows; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][r] += xv[j] * wv[i][j];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      if (r >= rows) break;
      float v[kWRows];
#pragma unroll
      for (int i = 0; i < kWRows; ++i) {
        v[i] = acc[i][r];
        for (int o = 16; o > 0; o >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
      }
      if (lane == 0) {
        float* yr = y + (r0 + r) * n_out;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          if (!ok[i]) continue;
          yr[c0 + i] = kSwiglu ? v[i] / (1.0f + expf(-v[i])) * v[i + 2] : v[i];
        }
      }
    }
  }
}

}  // namespace

void LaunchGroupedGemvBf16(const __nv_bfloat16* xb, int64_t k, const void* const* w_ptrs,
                           const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                           float* y, cudaStream_t s) {
  const int64_t cols = swiglu ? kWRows / 2 : kWRows;
  const dim3 g(static_cast<unsigned>((n_out + kGemvWarps * cols - 1) / (kGemvWarps * cols)), 1,
               static_cast<unsigned>(num_local));
  if (swiglu) {
    LaunchPdl(GroupedGemvBf16<true>, g, kGemvWarps * 32, 0, s, xb, k, w_ptrs, offsets, n_out, y);
  } else {
    LaunchPdl(GroupedGemvBf16<false>, g, kGemvWarps * 32, 0, s, xb, k, w_ptrs, offsets, n_out, y);
  }
}

void LaunchGroupedGemv(const float* x, int64_t k, const void* const* w_ptrs, bool bf16,
                       const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                       float* y, cudaStream_t s) {
  const dim3 g(static_cast<unsigned>((n_out + kGemvWarps - 1) / kGemvWarps), 1,
               static_cast<unsigned>(num_local));
  const int threads = 32 * kGemvWarps;
  if (bf16) {
    if (swiglu) {
      LaunchPdl(GroupedGemv<true, true>, g, threads, 0, s, x, k, w_ptrs, offsets, n_out, y);
    } else {
      LaunchPdl(GroupedGemv<true, false>, g, threads, 0, s, x, k, w_ptrs, offsets, n_out, y);
    }
  } else if (swiglu) {
    LaunchPdl(GroupedGemv<false, true>, g, threads, 0, s, x, k, w_ptrs, offsets, n_out, y);
  } else {
    LaunchPdl(GroupedGemv<false, false>, g, threads, 0, s, x, k, w_ptrs, offsets, n_out, y);
  }
}

void LaunchGroupedSimt(const float* x, int64_t m, int64_t k, const void* const* w_ptrs, bool bf16,
                       const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                       float* y, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((n_out + kTn - 1) / kTn),
                  static_cast<unsigned>((m + kTm - 1) / kTm), static_cast<unsigned>(num_local));
  if (bf16) {
    if (swiglu) {
      LaunchPdl(GroupedLinear<true, true>, grid, kThreads, 0, s, x, k, w_ptrs, offsets, n_out, y);
    } else {
      LaunchPdl(GroupedLinear<true, false>, grid, kThreads, 0, s, x, k, w_ptrs, offsets, n_out, y);
    }
  } else if (swiglu) {
    LaunchPdl(GroupedLinear<false, true>, grid, kThreads, 0, s, x, k, w_ptrs, offsets, n_out, y);
  } else {
    LaunchPdl(GroupedLinear<false, false>, grid, kThreads, 0, s, x, k, w_ptrs, offsets, n_out, y);
  }
}

}  // namespace afd::kernels::cuda

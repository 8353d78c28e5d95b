// MoE on the GPU: permute (device-side expert counts and offsets, tokens ascending within an
// expert), grouped expert GEMMs reading the per-expert row ranges on the device (no host loop
// over experts, no host sync), weighted combine in slot order.
#include <cuda_bf16.h>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/launch.cuh"

namespace afd::kernels::cuda {

namespace {

// One thread: deterministic and graph-safe; O(n·k + experts) with the cursors in shared
// memory (at most kMaxLocalExperts local experts).
constexpr int kMaxLocalExperts = 4096;

__global__ void Permute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t local,
                        int32_t* offsets, int32_t* src_row, int32_t* row_of_slot) {
  __shared__ int32_t cursor[kMaxLocalExperts];
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int64_t e = 0; e <= local; ++e) offsets[e] = 0;
  for (int64_t s = 0; s < n * k; ++s) {
    src_row[s] = 0;
    const int64_t e = ids[s] - begin;
    if (e >= 0 && e < local) ++offsets[e + 1];
  }
  for (int64_t e = 0; e < local; ++e) {
    offsets[e + 1] += offsets[e];
    cursor[e] = offsets[e];
  }
  for (int64_t s = 0; s < n * k; ++s) {  // slots ascending: tokens ascending within an expert
    const int64_t e = ids[s] - begin;
    if (e >= 0 && e < local) {
      const int32_t r = cursor[e]++;
      src_row[r] = static_cast<int32_t>(s / k);
      row_of_slot[s] = r;
    } else {
      row_of_slot[s] = -1;
    }
  }
}

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
  const int64_t e = blockIdx.z;
  const int64_t r0 = offsets[e] + int64_t(blockIdx.y) * kTm, r_end = offsets[e + 1];
  if (r0 >= r_end) return;
  const void* w = w_ptrs[e];
  const int64_t c0 = int64_t(blockIdx.x) * kTn;
  __shared__ float xs[kTm][kTk + 1];
  __shared__ float ws[kSwiglu ? 2 : 1][kTn][kTk + 1];
  // Each thread: 8 outputs (rows ty + 4i?), layout: 256 threads = 8 rows x 32 cols groups.
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;  // cols tx, tx+32; rows ty + 8j
  float acc[2][4][2] = {};  // [gate|up][row j][col i]
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
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(w) + idx);
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(p[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
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

__global__ void Combine(const float* y, int64_t h, const int32_t* ros, const float* w, int64_t k,
                        bool accumulate, float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    float o = accumulate ? out[t * h + i] : 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = ros[t * k + j];
      if (r >= 0) o += y[int64_t(r) * h + i] * w[t * k + j];
    }
    out[t * h + i] = o;
  }
}

}  // namespace

void LaunchMoePermute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t num_local,
                      int32_t* offsets, int32_t* src_row, int32_t* row_of_slot, cudaStream_t s) {
  AFD_CHECK(num_local <= kMaxLocalExperts, "MoePermute on cuda: {} local experts, at most {}",
            num_local, kMaxLocalExperts);
  Permute<<<1, 1, 0, s>>>(ids, n, k, begin, num_local, offsets, src_row, row_of_slot);
  CheckLaunch("MoePermute");
}

void LaunchGroupedLinear(const float* x, int64_t m, int64_t k, const void* const* w_ptrs, bool bf16,
                         const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                         float* y, cudaStream_t s) {
  if (m == 0 || num_local == 0) return;
  // Decode sizes (up to ~32 rows per expert on average): the per-column path reads each used
  // expert's weights once (row chunks re-read them from L1/L2). Needs K a multiple of 8
  // (16-byte loads). Prefill-sized groups take the tiled path.
  if (m <= 32 * num_local && k % 8 == 0) {
    const dim3 g(static_cast<unsigned>((n_out + kGemvWarps - 1) / kGemvWarps), 1,
                 static_cast<unsigned>(num_local));
    const int threads = 32 * kGemvWarps;
    if (bf16) {
      if (swiglu) {
        GroupedGemv<true, true><<<g, threads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
      } else {
        GroupedGemv<true, false><<<g, threads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
      }
    } else if (swiglu) {
      GroupedGemv<false, true><<<g, threads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
    } else {
      GroupedGemv<false, false><<<g, threads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
    }
    CheckLaunch("GroupedExpertMlp (gemv)");
    return;
  }
  const dim3 grid(static_cast<unsigned>((n_out + kTn - 1) / kTn),
                  static_cast<unsigned>((m + kTm - 1) / kTm), static_cast<unsigned>(num_local));
  if (bf16) {
    if (swiglu) {
      GroupedLinear<true, true><<<grid, kThreads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
    } else {
      GroupedLinear<true, false><<<grid, kThreads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
    }
  } else if (swiglu) {
    GroupedLinear<false, true><<<grid, kThreads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
  } else {
    GroupedLinear<false, false><<<grid, kThreads, 0, s>>>(x, k, w_ptrs, offsets, n_out, y);
  }
  CheckLaunch("GroupedExpertMlp");
}

void LaunchMoeCombine(const float* y, int64_t h, const int32_t* row_of_slot, const float* weights,
                      int64_t n, int64_t k, bool accumulate, float* out, cudaStream_t s) {
  if (n == 0) return;
  Combine<<<static_cast<unsigned>(n), 256, 0, s>>>(y, h, row_of_slot, weights, k, accumulate, out);
  CheckLaunch("MoeCombine");
}

}  // namespace afd::kernels::cuda

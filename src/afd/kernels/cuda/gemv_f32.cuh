// The fp32 GEMV's block (gemv.cu's GemvF32 and router.cu's RouterGateTopk share it, so the
// router gate's logits are the same bits whichever runs): y[r, c] = x[r, :] · w[c, :] for the
// block's up to kRowsMax rows and its kGemvF32Warps / splits columns. Warp w takes column
// blockIdx.x * (kGemvF32Warps / splits) + w / splits and K slice w % splits: its lanes stride
// over K in 16-byte loads, kGemvF32Loads in flight per lane (issued before the programmatic
// launch's wait: nothing writes the weights), per-lane sums in K order, the warp's sum over lanes,
// then the slices' sums added in slice order. One fixed order per (column, K, splits): a row's sum
// does not depend on the number of rows, and splits depends on the column count only.
#pragma once

#include <cstdint>

#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

inline constexpr int kGemvF32Warps = 8, kGemvF32Loads = 8;

// K slices per column: a small m (the router gate: 64-256 experts) still spreads over the SMs
// (64 columns: 64 blocks of one column each instead of 8 blocks of 8).
__host__ __device__ constexpr int GemvF32Splits(int64_t m) {
  return m <= 64 ? 8 : m <= 128 ? 4 : m <= 256 ? 2 : 1;
}

// The block's columns' sums for `rows` (<= kRowsMax) rows of x (row stride k; kStageX: staged by
// the block into xs, rows x k floats, after the wait), stored as y[r * m + c]. part: the block's
// shared [kGemvF32Warps][kRowsMax] partial sums. Every thread of the block must call it (it
// synchronizes the block); k % 4 == 0, x and w 16-byte aligned.
template <int kRowsMax, bool kStageX>
__device__ __forceinline__ void GemvF32Block(const float* x, int rows, int64_t k, const float* w,
                                             int64_t m, int splits, float* xs,
                                             float (&part)[kGemvF32Warps][kRowsMax], float* y) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * (kGemvF32Warps / splits) + warp / splits;
  const int slice = warp % splits;
  const bool active = c < m;
  const float* wc = w + (active ? c : 0) * k;
  const int64_t step = int64_t(splits) * 32 * 4;  // floats between a lane's consecutive loads
  int64_t k0 = (int64_t(slice) * 32 + lane) * 4;
  float4 wv[kGemvF32Loads];
  const auto load_weights = [&] {
#pragma unroll
    for (int u = 0; u < kGemvF32Loads; ++u) {
      if (k0 + u * step < k) wv[u] = *reinterpret_cast<const float4*>(wc + k0 + u * step);
    }
  };
  if (active) load_weights();
  PdlStart();  // the weights' first loads in flight before the wait; x only after
  if constexpr (kStageX) {
    for (int64_t i = threadIdx.x; i < rows * k / 4; i += blockDim.x) {
      reinterpret_cast<float4*>(xs)[i] = reinterpret_cast<const float4*>(x)[i];
    }
    __syncthreads();
  }
  const float* xr = kStageX ? xs : x;
  float acc[kRowsMax] = {};
  if (active) {
    for (;;) {
#pragma unroll
      for (int r = 0; r < kRowsMax; ++r) {
        if (r >= rows) break;
        float4 xv[kGemvF32Loads];
#pragma unroll
        for (int u = 0; u < kGemvF32Loads; ++u) {
          const int64_t kk = k0 + u * step;
          if (kk < k) xv[u] = *reinterpret_cast<const float4*>(xr + r * k + kk);
        }
#pragma unroll
        for (int u = 0; u < kGemvF32Loads; ++u) {
          if (k0 + u * step < k) {
            acc[r] += wv[u].x * xv[u].x + wv[u].y * xv[u].y + wv[u].z * xv[u].z + wv[u].w * xv[u].w;
          }
        }
      }
      k0 += kGemvF32Loads * step;
      if (k0 >= k) break;
      load_weights();
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsMax; ++r) {
    if (r >= rows) break;
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) part[warp][r] = v;
  }
  __syncthreads();
  if (active && slice == 0 && lane < rows) {  // lane r adds row r's slices in order
    float v = part[warp][lane];
    for (int s = 1; s < splits; ++s) v += part[warp + s][lane];
    y[lane * m + c] = v;
  }
}

}  // namespace afd::kernels::cuda

// The grouped expert GEMMs on WMMA tensor cores from fp32 activations, for bf16 experts with
// 16+ rows each where the mma.sync and tiled forms do not fit (moe_forms.cuh).
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

// Tensor-core path for bf16 experts with many rows per expert (large decode batches, prefill):
// bf16 WMMA 16x16x16 fragments, fp32 accumulation; the fp32 activations are rounded to bf16
// while staged in shared memory (as the dense cuBLAS GEMMs do). Block tile: 32 rows x 64 cols,
// one 16x16 output fragment per warp (8 warps), gate and up fragments for SwiGLU; K in chunks
// of 64. Weights [N, K] row-major are read straight from global memory as col-major B.
// grid: (ceil(n_out / 64), ceil(m / 32), num_local); needs K % 16 == 0.
constexpr int kWmTm = 32, kWmTn = 64, kWmTk = 64;

template <bool kSwiglu>
__global__ void GroupedWmma(const float* x, int64_t k, const void* const* w_ptrs,
                            const int32_t* offsets, int64_t n_out, float* y) {
  PdlStart();
  using namespace nvcuda;
  const int64_t e = blockIdx.z;
  const int64_t r0 = offsets[e] + int64_t(blockIdx.y) * kWmTm, r_end = offsets[e + 1];
  if (r0 >= r_end) return;
  const int64_t c0 = int64_t(blockIdx.x) * kWmTn;
  const auto* w = static_cast<const __nv_bfloat16*>(w_ptrs[e]);
  __shared__ __align__(32) __nv_bfloat16 xs[kWmTm][kWmTk + 16];
  __shared__ __align__(32) float out[2][kWmTm][kWmTn + 4];
  const int warp = threadIdx.x >> 5, wr = warp / 4, wc = warp % 4;  // 2 x 4 fragments
  const int64_t col = c0 + wc * 16;
  const bool col_ok = col + 16 <= n_out;  // n_out % 16 == 0 in practice; else this warp idles
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_g, acc_u;
  wmma::fill_fragment(acc_g, 0.0f);
  wmma::fill_fragment(acc_u, 0.0f);
  for (int64_t k0 = 0; k0 < k; k0 += kWmTk) {
    for (int i = threadIdx.x; i < kWmTm * kWmTk; i += blockDim.x) {
      const int rr = i / kWmTk, kk = i % kWmTk;
      const int64_t r = r0 + rr, kg = k0 + kk;
      xs[rr][kk] = __float2bfloat16_rn((r < r_end && kg < k) ? x[r * k + kg] : 0.0f);
    }
    __syncthreads();
    if (col_ok) {
      for (int kk = 0; kk < kWmTk && k0 + kk < k; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, &xs[wr * 16][kk], kWmTk + 16);
        wmma::load_matrix_sync(b, w + col * k + k0 + kk, static_cast<unsigned>(k));
        wmma::mma_sync(acc_g, a, b, acc_g);
        if (kSwiglu) {
          wmma::load_matrix_sync(b, w + (col + n_out) * k + k0 + kk, static_cast<unsigned>(k));
          wmma::mma_sync(acc_u, a, b, acc_u);
        }
      }
    }
    __syncthreads();
  }
  if (col_ok) {
    wmma::store_matrix_sync(&out[0][wr * 16][wc * 16], acc_g, kWmTn + 4, wmma::mem_row_major);
    if (kSwiglu) {
      wmma::store_matrix_sync(&out[1][wr * 16][wc * 16], acc_u, kWmTn + 4, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kWmTm * kWmTn; i += blockDim.x) {
    const int rr = i / kWmTn, cc = i % kWmTn;
    const int64_t r = r0 + rr, c = c0 + cc;
    if (r >= r_end || c >= n_out || c0 + (cc / 16) * 16 + 16 > n_out) continue;
    const float g = out[0][rr][cc];
    y[r * n_out + c] = kSwiglu ? g / (1.0f + expf(-g)) * out[1][rr][cc] : g;
  }
}

}  // namespace

bool WmmaFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local) {
  return m >= 16 * num_local && k % 16 == 0 && n_out % 16 == 0;
}

void LaunchGroupedWmma(const float* x, int64_t m, int64_t k, const void* const* w_ptrs,
                       const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                       float* y, cudaStream_t s) {
  const dim3 g(static_cast<unsigned>((n_out + kWmTn - 1) / kWmTn),
               static_cast<unsigned>((m + kWmTm - 1) / kWmTm), static_cast<unsigned>(num_local));
  if (swiglu) {
    LaunchPdl(GroupedWmma<true>, g, 256, 0, s, x, k, w_ptrs, offsets, n_out, y);
  } else {
    LaunchPdl(GroupedWmma<false>, g, 256, 0, s, x, k, w_ptrs, offsets, n_out, y);
  }
}

}  // namespace afd::kernels::cuda

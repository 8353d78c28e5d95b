// The AFD exchange ops (kernels/backend.h, "AFD exchange"): the attention role's dispatch layout
// and row writes into the FFN ranks' windows, the combine of per-rank partial sums, the index of
// per-pair replies, and f32 <-> bf16 conversion. No host sync: every count stays on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cub/block/block_scan.cuh>

#include "afd/kernels/afd_exchange.h"
#include "afd/kernels/cuda/afd.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kLayoutThreads = 1024;

// Block f: rank f's rows. Tokens t % F == f at row t / F, then the others with an expert here in
// token order (a block-wide scan per chunk of tokens); ids and weights into the rank's table,
// ids -1 past its tokens.
__global__ void AfdLayoutKernel(const int32_t* ids, const int32_t* weight_bits, int64_t n, int k,
                                int64_t num_experts, int num_ranks, bool shared, AfdRankPtrs tables,
                                int32_t* send_row) {
  PdlStart();
  using Scan = cub::BlockScan<int, kLayoutThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t running;
  const int f = blockIdx.x;
  auto* table = static_cast<int32_t*>(tables.p[f]);
  if (threadIdx.x == 0) running = shared ? AfdOwnedTokens(n, num_ranks, f) : 0;
  __syncthreads();
  for (int64_t base = 0; base < n; base += kLayoutThreads) {
    const int64_t t = base + threadIdx.x;
    bool own = false, here = false;
    if (t < n) {
      own = shared && t % num_ranks == f;
      for (int j = 0; j < k && !own && !here; ++j) {
        here = ExpertOwner(ids[t * k + j], num_experts, num_ranks) == f;
      }
    }
    int prefix = 0, total = 0;
    Scan(scan).ExclusiveSum(here ? 1 : 0, prefix, total);
    const int64_t r = own ? t / num_ranks : (here ? running + prefix : -1);
    if (t < n) {
      send_row[t * num_ranks + f] = static_cast<int32_t>(r);
      if (r >= 0) {
        for (int j = 0; j < k; ++j) {
          table[r * k + j] = ids[t * k + j];
          table[n * k + r * k + j] = weight_bits[t * k + j];
        }
      }
    }
    __syncthreads();  // every thread read `running`
    if (threadIdx.x == 0) running += total;
    __syncthreads();
  }
  for (int64_t i = running * k + threadIdx.x; i < n * k; i += kLayoutThreads) table[i] = -1;
}

// Block t: token t's row into every rank that gets it (f32, rounded to bf16, or FP8 with its
// group scales: afd_exchange.h -- a warp per group of 128, each group quantized once for every
// FP8 rank).
__global__ void AfdRowsKernel(const float* hidden, int64_t n, int64_t h, int num_ranks,
                              AfdRankPtrs rows, uint64_t bf16_mask, uint64_t fp8_mask,
                              AfdRankPtrs scales, const int32_t* send_row) {
  PdlStart();
  const int64_t t = blockIdx.x;
  const float* x = hidden + t * h;
  uint64_t fp8_here = 0;
  for (int f = 0; f < num_ranks; ++f) {
    const int32_t r = send_row[t * num_ranks + f];
    if (r < 0) continue;
    if ((fp8_mask >> f) & 1) {
      fp8_here |= uint64_t{1} << f;
    } else if ((bf16_mask >> f) & 1) {
      auto* dst = static_cast<__nv_bfloat16*>(rows.p[f]) + static_cast<int64_t>(r) * h;
      for (int64_t c = threadIdx.x; c < h; c += blockDim.x) dst[c] = __float2bfloat16_rn(x[c]);
    } else {
      float* dst = static_cast<float*>(rows.p[f]) + static_cast<int64_t>(r) * h;
      for (int64_t c = threadIdx.x; c < h; c += blockDim.x) dst[c] = x[c];
    }
  }
  if (fp8_here == 0) return;
  constexpr int kPerLane = kAfdFp8Group / 32;
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t groups = AfdFp8Groups(h);
  for (int64_t g = threadIdx.x / 32; g < groups; g += warps) {
    float v[kPerLane];
    float amax = 0.0f;
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t c = g * kAfdFp8Group + lane + 32 * i;
      v[i] = c < h ? x[c] : 0.0f;
      amax = fmaxf(amax, fabsf(v[i]));
    }
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float a = AfdFp8Clamp(amax), mul = AfdFp8Mul(a);
    __nv_fp8_storage_t q[kPerLane];
    for (int i = 0; i < kPerLane; ++i) {
      q[i] = __nv_cvt_float_to_fp8(__fmul_rn(v[i], mul), __NV_SATFINITE, __NV_E4M3);
    }
    for (int f = 0; f < num_ranks; ++f) {
      if (!((fp8_here >> f) & 1)) continue;
      const int64_t r = send_row[t * num_ranks + f];
      auto* dst = static_cast<__nv_fp8_storage_t*>(rows.p[f]) + r * h;
      for (int i = 0; i < kPerLane; ++i) {
        const int64_t c = g * kAfdFp8Group + lane + 32 * i;
        if (c < h) dst[c] = q[i];
      }
      if (lane == 0) static_cast<float*>(scales.p[f])[r * groups + g] = AfdFp8Scale(a);
    }
  }
}

__global__ void DequantFp8RowsKernel(const __nv_fp8_storage_t* q, const float* scales, int64_t m,
                                     int64_t h, float* out) {
  PdlStart();
  const int64_t groups = AfdFp8Groups(h);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m * h;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h, c = i % h;
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3)));
    out[i] = __fmul_rn(v, scales[r * groups + c / kAfdFp8Group]);
  }
}

__global__ void AfdSumPartialsKernel(AfdRankPtrs partials, const int32_t* send_row, int64_t n,
                                     int64_t h, int num_ranks, float* out) {
  PdlStart();
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float acc = 0.0f;
    bool first = true;
    for (int f = 0; f < num_ranks; ++f) {
      const int32_t r = send_row[t * num_ranks + f];
      if (r < 0) continue;
      const float v = static_cast<const float*>(partials.p[f])[static_cast<int64_t>(r) * h + c];
      acc = first ? v : acc + v;
      first = false;
    }
    out[t * h + c] = acc;
  }
}

__global__ void AfdPairIndexKernel(const int32_t* ids, int64_t n, int k, int64_t num_experts,
                                   int num_ranks, const int32_t* send_row, AfdRankPtrs row_of_slot,
                                   AfdRankInts base, AfdRankInts shared_base, int32_t* idx,
                                   int32_t* shared_idx) {
  PdlStart();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * k;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / k, j = i % k;
    const int f = ExpertOwner(ids[i], num_experts, num_ranks);
    const int32_t r = send_row[t * num_ranks + f];
    const int32_t g =
        r < 0 ? -1 : static_cast<const int32_t*>(row_of_slot.p[f])[static_cast<int64_t>(r) * k + j];
    idx[i] = g < 0 ? -1 : static_cast<int32_t>(base.v[f] + g);
    if (j == 0 && shared_idx != nullptr) {
      shared_idx[t] = static_cast<int32_t>(shared_base.v[t % num_ranks] + t / num_ranks);
    }
  }
}

__global__ void Bf16ToF32Kernel(const __nv_bfloat16* x, int64_t n, float* out) {
  PdlStart();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat162float(x[i]);
  }
}

unsigned GridFor(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 4096));
}

}  // namespace

void LaunchAfdDispatch(const float* hidden, const int32_t* ids, const float* weights, int64_t n,
                       int64_t k, int64_t h, int64_t num_experts, int num_ranks,
                       const AfdRankPtrs& rows, uint64_t bf16_mask, uint64_t fp8_mask,
                       const AfdRankPtrs& scales, const AfdRankPtrs& tables, int32_t* send_row,
                       bool shared, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(AfdLayoutKernel, static_cast<unsigned>(num_ranks), kLayoutThreads, 0, s, ids,
            reinterpret_cast<const int32_t*>(weights), n, static_cast<int>(k), num_experts,
            num_ranks, shared, tables, send_row);
  CheckLaunch("AfdDispatch (layout)");
  LaunchPdl(AfdRowsKernel, static_cast<unsigned>(n), 256, 0, s, hidden, n, h, num_ranks, rows,
            bf16_mask, fp8_mask, scales, static_cast<const int32_t*>(send_row));
  CheckLaunch("AfdDispatch (rows)");
}

void LaunchAfdSumPartials(const AfdRankPtrs& partials, const int32_t* send_row, int64_t n,
                          int64_t h, int num_ranks, float* out, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(AfdSumPartialsKernel, static_cast<unsigned>(n), 256, 0, s, partials, send_row, n, h,
            num_ranks, out);
  CheckLaunch("AfdSumPartials");
}

void LaunchAfdPairIndex(const int32_t* ids, int64_t n, int64_t k, int64_t num_experts,
                        int num_ranks, const int32_t* send_row, const AfdRankPtrs& row_of_slot,
                        const AfdRankInts& base, const AfdRankInts& shared_base, int32_t* idx,
                        int32_t* shared_idx, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(AfdPairIndexKernel, GridFor(n * k, 256), 256, 0, s, ids, n, static_cast<int>(k),
            num_experts, num_ranks, send_row, row_of_slot, base, shared_base, idx, shared_idx);
  CheckLaunch("AfdPairIndex");
}

void LaunchDequantFp8Rows(const uint8_t* q, const float* scales, int64_t m, int64_t h, float* out,
                          cudaStream_t s) {
  if (m * h == 0) return;
  LaunchPdl(DequantFp8RowsKernel, GridFor(m * h, 256), 256, 0, s,
            reinterpret_cast<const __nv_fp8_storage_t*>(q), scales, m, h, out);
  CheckLaunch("DequantFp8Rows");
}

void LaunchBf16ToF32(const uint16_t* x, int64_t n, float* out, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(Bf16ToF32Kernel, GridFor(n, 256), 256, 0, s, reinterpret_cast<const __nv_bfloat16*>(x),
            n, out);
  CheckLaunch("Convert (bf16 -> f32)");
}

}  // namespace afd::kernels::cuda

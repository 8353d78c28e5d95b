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
#include "afd/kernels/cuda/gemv.cuh"
#include "afd/kernels/cuda/gemv_f32.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kWarps = 8;

// The 8 floats a | b, each rounded to bf16 (as LaunchToBf16 does before a cuBLAS bf16 GEMM:
// the same products either way).
__device__ __forceinline__ void RoundToBf16(const float4& a, const float4& b, float* out) {
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

// Each lane issues kLoads 16-byte weight loads before using any (a 2048-wide row is one round
// trip): at decode sizes these kernels are bound by load latency, not bandwidth. The bf16 form
// stages x once per block in shared memory, rounded to bf16 (kStageX, when rows x K fits in
// kStageBytes), while the first weight loads are in flight; otherwise each row of x is loaded
// from L1/L2 in the same batches.
constexpr int kLoads = 8;
constexpr int64_t kStageBytes = 48 * 1024;

// The kLoads weight vectors of lane slab k0 (those past k are left alone).
__device__ __forceinline__ void LoadWeights(const __nv_bfloat16* wc, int64_t k0, int64_t k,
                                            uint4 (&wv)[kLoads]) {
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    if (k0 + u * 32 * 8 < k) wv[u] = *reinterpret_cast<const uint4*>(wc + k0 + u * 32 * 8);
  }
}

template <int kRowsMax, bool kStageX>
__global__ void __launch_bounds__(kWarps * 32)
    GemvBf16(const float* x, int rows, int64_t k, const __nv_bfloat16* w, int64_t m, float* y) {
  extern __shared__ uint4 xs4[];  // kStageX: x [rows, k] as bf16
  const int lane = threadIdx.x & 31;
  const int64_t c = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const bool active = c < m;
  const __nv_bfloat16* wc = w + (active ? c : 0) * k;
  uint4 wv[kLoads];
  int64_t k0 = int64_t(lane) * 8;
  if (active) LoadWeights(wc, k0, k, wv);
  // The first weight loads (a 2048-wide row's all) are in flight before waiting for the kernel
  // before this one (programmatic launch: nothing writes the weights); x only after.
  PdlStart();
  if constexpr (kStageX) {
    for (int64_t i = threadIdx.x; i < rows * k / 8; i += blockDim.x) {
      float xa[8];
      RoundToBf16(reinterpret_cast<const float4*>(x)[2 * i],
                  reinterpret_cast<const float4*>(x)[2 * i + 1], xa);
      uint4 packed;
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = __floats2bfloat162_rn(xa[2 * e], xa[2 * e + 1]);
      xs4[i] = packed;
    }
    __syncthreads();
  }
  if (!active) return;
  float acc[kRowsMax] = {};
  for (;;) {
#pragma unroll
    for (int r = 0; r < kRowsMax; ++r) {
      if (r >= rows) break;
      float4 xv[kStageX ? 1 : kLoads][2];
      if constexpr (!kStageX) {
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          if (k0 + u * 32 * 8 < k) {
            const float* xp = x + r * k + k0 + u * 32 * 8;
            xv[u][0] = *reinterpret_cast<const float4*>(xp);
            xv[u][1] = *reinterpret_cast<const float4*>(xp + 4);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int64_t kk = k0 + u * 32 * 8;
        if (kk < k) {
          float f[8], xa[8];
          Unpack8Bf16(wv[u], f);
          if constexpr (kStageX) {
            Unpack8Bf16(xs4[(r * k + kk) / 8], xa);
          } else {
            RoundToBf16(xv[u][0], xv[u][1], xa);
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r] += f[i] * xa[i];
        }
      }
    }
    k0 += kLoads * 32 * 8;
    if (k0 >= k) break;
    LoadWeights(wc, k0, k, wv);
  }
  StoreWarpSums<kRowsMax>(acc, rows, lane, y + c, m);
}

// The fp32-weight form (the router gate, and every Linear with --dtype fp32): GemvF32Block
// (gemv_f32.cuh), x staged in shared memory as it is (kStageX: one column per warp only) or read
// from L1/L2. blockIdx.y picks a chunk of kRowsMax rows (more than kRowsMax rows in one launch:
// the router gate at decode batch 9-16); a row's sum is the same whatever its chunk and the
// number of rows.
template <int kRowsMax, bool kStageX>
__global__ void __launch_bounds__(kGemvF32Warps * 32)
    GemvF32(const float* x, int rows, int64_t k, const float* w, int64_t m, int splits, float* y) {
  extern __shared__ float4 xf4[];  // kStageX: this chunk's x [rows, k]
  __shared__ float part[kGemvF32Warps][kRowsMax];
  x += int64_t(blockIdx.y) * kRowsMax * k;
  y += int64_t(blockIdx.y) * kRowsMax * m;
  rows = min(rows - int(blockIdx.y) * kRowsMax, kRowsMax);
  GemvF32Block<kRowsMax, kStageX>(x, rows, k, w, m, splits, reinterpret_cast<float*>(xf4), part, y);
}

// fp32 y[n, m] = x[n, k] · wᵀ for many rows and few columns (the router gate at prefill: 8192 x
// 2048 -> 64, where cuBLAS's SGEMM runs at ~2 TFLOP/s). Block: kSkinnyRows rows x kSkinnyCols
// columns, K in steps of kSkinnyK staged in shared memory transposed ([k][row], [k][col]), the
// next step's loads in registers while this one is summed; thread (ty, tx) of 16 x 16 sums rows
// 4 ty .. and columns 4 tx .. over k in order (fp32 FMA, one deterministic order per output).
// Needs k % 4 == 0 and 16-byte aligned rows.
constexpr int kSkinnyRows = 64, kSkinnyCols = 64, kSkinnyK = 32;
constexpr int64_t kSkinnyMinRows = 512, kSkinnyMaxCols = 256;

__global__ void __launch_bounds__(256)
    SkinnyF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y) {
  PdlStart();
  __shared__ __align__(16) float xs[kSkinnyK][kSkinnyRows + 4];
  __shared__ __align__(16) float ws[kSkinnyK][kSkinnyCols + 4];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int64_t r0 = int64_t(blockIdx.y) * kSkinnyRows, c0 = int64_t(blockIdx.x) * kSkinnyCols;
  // Loads: thread tid takes row tid / 4 of the tile, k 4 (tid % 4) .. + 3 and 16 more (two
  // float4 a step).
  const int lr = tid / 4, lk = (tid % 4) * 4;
  const bool x_ok = r0 + lr < n, w_ok = c0 + lr < m;
  const float* xp = x + (x_ok ? r0 + lr : 0) * k + lk;
  const float* wp = w + (w_ok ? c0 + lr : 0) * k + lk;
  float4 xv[2], wv[2];
  const auto load = [&](int64_t k0) {
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool k_ok = k0 + lk + 16 * h < k;
      xv[h] = x_ok && k_ok ? *reinterpret_cast<const float4*>(xp + k0 + 16 * h) : zero;
      wv[h] = w_ok && k_ok ? *reinterpret_cast<const float4*>(wp + k0 + 16 * h) : zero;
    }
  };
  float acc[4][4] = {};
  load(0);
  for (int64_t k0 = 0; k0 < k; k0 += kSkinnyK) {
    __syncthreads();  // the previous step's tiles are consumed
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kk = lk + 16 * h;
      xs[kk][lr] = xv[h].x, xs[kk + 1][lr] = xv[h].y, xs[kk + 2][lr] = xv[h].z;
      xs[kk + 3][lr] = xv[h].w;
      ws[kk][lr] = wv[h].x, ws[kk + 1][lr] = wv[h].y, ws[kk + 2][lr] = wv[h].z;
      ws[kk + 3][lr] = wv[h].w;
    }
    __syncthreads();
    if (k0 + kSkinnyK < k) load(k0 + kSkinnyK);  // in flight while this step is summed
#pragma unroll
    for (int kk = 0; kk < kSkinnyK; ++kk) {
      const float4 a = *reinterpret_cast<const float4*>(&xs[kk][4 * ty]);
      const float4 b = *reinterpret_cast<const float4*>(&ws[kk][4 * tx]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 4 * ty + i;
    if (r >= n) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + 4 * tx + j;
      if (c < m) y[r * m + c] = acc[i][j];
    }
  }
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

bool GemvF32Fits(int64_t n, int64_t k, int64_t m) {
  static const bool chunks_off = ChoiceOff("AFD_GEMV_F32_CHUNKS");  // cuBLAS above 8 rows
  if (chunks_off && n > kMaxGemvRows) return false;
  return n >= 1 && k % 4 == 0 &&
         (n <= kMaxGemvRows || (n <= kMaxGemvF32Rows && m <= kMaxGemvF32ChunkedCols));
}

void LaunchGemvF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y,
                   cudaStream_t s) {
  AFD_CHECK(GemvF32Fits(n, k, m), "GemvF32: {} rows of K = {}, N = {}", n, k, m);
  const int splits = GemvF32Splits(m), cols = kGemvF32Warps / splits;
  const dim3 blocks(static_cast<unsigned>((m + cols - 1) / cols),
                    static_cast<unsigned>((n + kMaxGemvRows - 1) / kMaxGemvRows));
  const int64_t stage_bytes = std::min<int64_t>(n, kMaxGemvRows) * k * 4;
  ByRowBound(n, [&](auto bound) {
    constexpr int kRows = decltype(bound)::value;
    // Staging pays when a block's warps read x for several columns.
    if (splits == 1 && stage_bytes <= kStageBytes) {
      LaunchPdl(GemvF32<kRows, true>, blocks, kGemvF32Warps * 32, stage_bytes, s, x,
                static_cast<int>(n), k, w, m, splits, y);
    } else {
      LaunchPdl(GemvF32<kRows, false>, blocks, kGemvF32Warps * 32, 0, s, x, static_cast<int>(n), k,
                w, m, splits, y);
    }
  });
  CheckLaunch("Linear (gemv f32)");
}

bool GemvFits(int64_t n, int64_t k) { return n >= 1 && n <= kMaxGemvRows && k % 8 == 0; }

void LaunchGemvBf16(const float* x, int64_t n, int64_t k, const void* w, int64_t m, float* y,
                    cudaStream_t s) {
  AFD_CHECK(GemvFits(n, k), "GemvBf16: {} rows of K = {}", n, k);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
  const int64_t stage_bytes = n * k * 2;
  ByRowBound(n, [&](auto bound) {
    constexpr int kRows = decltype(bound)::value;
    if (stage_bytes <= kStageBytes) {
      LaunchPdl(GemvBf16<kRows, true>, blocks, kWarps * 32, stage_bytes, s, x, static_cast<int>(n),
                k, wb, m, y);
    } else {
      LaunchPdl(GemvBf16<kRows, false>, blocks, kWarps * 32, 0, s, x, static_cast<int>(n), k, wb, m,
                y);
    }
  });
  CheckLaunch("Linear (gemv)");
}

bool SkinnyF32Fits(int64_t n, int64_t k, int64_t m) {
  return n >= kSkinnyMinRows && m <= kSkinnyMaxCols && k % 4 == 0 &&
         (n + kSkinnyRows - 1) / kSkinnyRows <= 65535;
}

void LaunchSkinnyF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y,
                     cudaStream_t s) {
  AFD_CHECK(SkinnyF32Fits(n, k, m), "SkinnyF32: {} rows, K = {}, N = {}", n, k, m);
  const dim3 grid(static_cast<unsigned>((m + kSkinnyCols - 1) / kSkinnyCols),
                  static_cast<unsigned>((n + kSkinnyRows - 1) / kSkinnyRows));
  LaunchPdl(SkinnyF32, grid, 256, 0, s, x, n, k, w, m, y);
  CheckLaunch("Linear (skinny f32)");
}

}  // namespace afd::kernels::cuda

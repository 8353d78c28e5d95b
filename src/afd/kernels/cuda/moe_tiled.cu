// The grouped expert GEMMs with many rows per expert (prefill): a tiled tensor-core GEMM on
// wgmma (sm_90a) or mma.sync; also the dense TiledLinear (moe.cuh, moe_forms.cuh).
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

// Tensor-core path for bf16 experts with many rows per expert (prefill): a tiled grouped GEMM,
// compute-bound where GroupedMma (one pass of <= 32 rows per weight read) is bound by the L2.
// Block tile: kTileM = 128 rows of one expert x kTileN = 128 weight rows, K in steps of
// kTileK = 64 through a kTileStages-deep cp.async pipeline in shared memory; 8 warps as 2 (M) x 4
// (N), each a 64 x 32 tile (4 m16 x 4 n8 tiles of mma.m16n8k16, fp32 accumulators), operands by
// ldmatrix. Shared rows are 128 bytes with their 16-byte chunks XOR-swizzled by row (chunk c of
// row r at c ^ (r % 8)), so the 8 rows of an ldmatrix phase and the copies hit distinct banks.
//
// x: the bf16 rows [m, k], grouped by expert (offsets); w_ptrs[e]: [n_w, k] row-major, so both
// operands are K-major (A row-major, B "col", as mma's .row.col wants). SwiGLU: the block's 128
// weight rows are 8-row groups alternating gate (rows n0 + 8p ..) and up (n_out + n0 + 8p ..), so
// an n8 tile pair holds the gate and up of the same 8 output columns and the epilogue writes
// silu(gate) * up for kTileN / 2 columns; plain: kTileN columns. Rows past the expert's segment
// and weight rows past n_out are zeros (cp.async zero fill) and never stored. The sums run over
// K in order per k16 step, as the GroupedMma path's do not: the two paths differ in the last
// bits.
//
// grid: (column blocks, m-tile slots): slot y is the y-th 128-row tile of the experts' segments
// taken in expert order (device-side counts: a warp prefix sum over the offsets); slots past the
// last tile exit at once (the host sizes the grid by ceil(m / 128) + num_local). offsets null: a
// dense GEMM, the m rows (num_local = m here) and one weight matrix, w_ptrs pointing at it. Needs
// k % 8 == 0 and 16-byte aligned rows.
constexpr int kTileM = 128, kTileN = 128, kTileK = 64, kTileStages = 3, kTileThreads = 256;
constexpr int64_t kTiledLinearMinRows = 512;  // dense Linear: below, cuBLAS (or the GEMVs)
constexpr int kTileStageBytes = (kTileM + kTileN) * kTileK * 2;  // 32 KB

__device__ __forceinline__ int TileSwizzle(int row, int chunk) {
  return row * (kTileK / 8) + (chunk ^ (row & 7));  // in 16-byte units
}

// A tiled epilogue's SwiGLU pair: silu(g) · u for two adjacent output columns at element `at`,
// as bf16 into yb (kBf16Out) or fp32 into y.
template <bool kBf16Out>
__device__ __forceinline__ void StoreSwiglu(float g0, float g1, float u0, float u1, int64_t at,
                                            float* y, __nv_bfloat16* yb) {
  const float2 v = make_float2(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
  if constexpr (kBf16Out) {
    *reinterpret_cast<__nv_bfloat162*>(yb + at) = __floats2bfloat162_rn(v.x, v.y);
  } else {
    *reinterpret_cast<float2*>(y + at) = v;
  }
}

// kWg (sm_90a): the same tiles and pipeline, the products on wgmma instead: the two
// warpgroups of the block each take 64 rows x the 128 weight rows (m64n128k16, both operands
// read from the swizzled stages by descriptor, which is the layout TileSwizzle writes); the
// stages start 1024-byte aligned (the dynamic shared memory has 1 KB more for that).
template <bool kSwiglu, bool kBf16Out, bool kWg = false>
__global__ void __launch_bounds__(kTileThreads, 2)
    GroupedTiled(const __nv_bfloat16* x, int64_t k, const void* const* w_ptrs,
                 const int32_t* offsets, int64_t num_local, int64_t n_out, float* y,
                 __nv_bfloat16* yb) {
  PdlStart();
  extern __shared__ __align__(1024) uint4 tile_smem_raw[];
  uint4* tile_smem = tile_smem_raw;
  if constexpr (kWg) {
    const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(tile_smem_raw));
    tile_smem += ((1024 - (a & 1023)) & 1023) / 16;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, t = lane & 3;
  // Which expert and which of its m tiles: slot blockIdx.y in expert order.
  int64_t slot = blockIdx.y, e = -1, row0 = 0, row_end = 0;
  if (offsets == nullptr) {  // dense: num_local holds m
    e = 0;
    row0 = slot * kTileM;
    row_end = num_local;
  }
  for (int64_t base = 0; offsets != nullptr && base < num_local; base += 32) {
    const int64_t ee = base + lane;
    const int64_t count = ee < num_local ? offsets[ee + 1] - offsets[ee] : 0;
    const int tiles = static_cast<int>((count + kTileM - 1) / kTileM);
    int incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (slot < total) {
      const unsigned past = __ballot_sync(0xffffffffu, incl > slot);
      const int f = __ffs(past) - 1;
      const int before = __shfl_sync(0xffffffffu, incl - tiles, f);
      e = base + f;
      row0 = offsets[e] + (slot - before) * kTileM;
      row_end = offsets[e + 1];
      break;
    }
    slot -= total;
  }
  if (e < 0) return;  // the whole block
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTileM), row_end - row0));
  if (row0 >= row_end) return;
  const auto* w = static_cast<const __nv_bfloat16*>(offsets == nullptr ? w_ptrs : w_ptrs[e]);
  const int64_t n0 = int64_t(blockIdx.x) * (kSwiglu ? kTileN / 2 : kTileN);
  // This thread's copies per stage: 4 chunks of A and 4 of B (rows threadIdx / 8 + 32 i, chunk
  // threadIdx % 8).
  const int cchunk = threadIdx.x & 7, crow = threadIdx.x >> 3;
  const __nv_bfloat16* a_base = x + row0 * k + cchunk * 8;
  const __nv_bfloat16* b_base = w + cchunk * 8;
  int w_row[4];     // weight rows (a row past the valid ones: row 0, never read)
  unsigned ok = 0;  // bit i: A row i valid; bit 4 + i: B row i valid
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = crow + 32 * i;
    ok |= r < rows ? 1u << i : 0u;
    const int64_t col = kSwiglu ? n0 + (r / 16) * 8 + (r % 8) : n0 + r;
    ok |= col < n_out ? 1u << (4 + i) : 0u;
    w_row[i] = col < n_out ? static_cast<int>((kSwiglu && r % 16 >= 8 ? n_out : 0) + col) : 0;
  }
  const int64_t k_tiles = (k + kTileK - 1) / kTileK;
  const auto load = [&](int64_t kt) {
    uint4* st = tile_smem + (kt % kTileStages) * (kTileStageBytes / 16);
    const int64_t kk = kt * kTileK;
    const bool k_ok = kk + cchunk * 8 < k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = crow + 32 * i;
      const bool a_ok = (ok >> i & 1u) && k_ok, b_ok = (ok >> (4 + i) & 1u) && k_ok;
      CopyAsync16Or0(st + TileSwizzle(r, cchunk), a_base + (a_ok ? r * k + kk : 0), a_ok);
      CopyAsync16Or0(st + kTileM * (kTileK / 8) + TileSwizzle(r, cchunk),
                     b_base + (b_ok ? w_row[i] * k + kk : 0), b_ok);
    }
  };
#pragma unroll
  for (int s = 0; s < kTileStages - 1; ++s) {
    if (s < k_tiles) load(s);
    CopyAsyncCommit();
  }
  if constexpr (kWg) {
#ifdef AFD_HAS_WGMMA
    const int wg = warp >> 2, w4 = warp & 3;  // warpgroup: rows 64 wg ..; its warp: 16 rows
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      CopyAsyncWait<kTileStages - 2>();
      FenceProxyAsyncShared();
      __syncthreads();  // stage kt landed for every thread; every warpgroup is done with kt - 1
      if (kt + kTileStages - 1 < k_tiles) load(kt + kTileStages - 1);
      CopyAsyncCommit();
      const uint4* st = tile_smem + (kt % kTileStages) * (kTileStageBytes / 16);
      const uint64_t a_desc = Sw128Desc(st + wg * 64 * (kTileK / 8));
      const uint64_t b_desc = Sw128Desc(st + kTileM * (kTileK / 8));
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kTileK / 16; ++ks) {
        Wgmma64x128Bf16(acc, a_desc + 2 * ks, b_desc + 2 * ks);
      }
      WgmmaCommit();
      WgmmaWait<0>();
    }
    CopyAsyncWait<0>();
    // Epilogue: acc[4j + {0, 1}] at (16 w4 + gid, 8j + 2t + {0, 1}), acc[4j + {2, 3}] 8 rows on.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wg * 64 + 16 * w4 + 8 * h + gid;
      if (r >= rows) continue;
      const int64_t row = row0 + r;
      if constexpr (kSwiglu) {
#pragma unroll
        for (int p = 0; p < kTileN / 16; ++p) {
          const int64_t col = n0 + 8 * p + 2 * t;
          if (col >= n_out) continue;
          StoreSwiglu<kBf16Out>(acc[8 * p + 2 * h], acc[8 * p + 2 * h + 1], acc[8 * p + 4 + 2 * h],
                                acc[8 * p + 4 + 2 * h + 1], row * n_out + col, y, yb);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kTileN / 8; ++j) {
          const int64_t col = n0 + 8 * j + 2 * t;
          if (col >= n_out) continue;
          *reinterpret_cast<float2*>(y + row * n_out + col) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
      }
    }
#else
    __trap();  // launched only on sm_90 (LaunchTiled), whose code is sm_90a's
#endif
    return;
  } else {
    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows 64 wm.., weight rows 32 wn..
    float acc[4][4][4] = {};
    // ldmatrix row addresses: A x4 = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
    // (rows 8-15, k 8-15) of an m16 tile; B x4 = (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
    // (n 8-15, k 8-15) of two n8 tiles.
    const int a_row = wm * 64 + (lane & 7) + ((lane >> 3) & 1) * 8, a_chunk = lane >> 4;
    const int b_row = wn * 32 + (lane & 7) + (lane >> 4) * 8, b_chunk = (lane >> 3) & 1;
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      CopyAsyncWait<kTileStages - 2>();
      __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free
      if (kt + kTileStages - 1 < k_tiles) load(kt + kTileStages - 1);
      CopyAsyncCommit();
      const uint4* st = tile_smem + (kt % kTileStages) * (kTileStageBytes / 16);
      const uint4* bs = st + kTileM * (kTileK / 8);
#pragma unroll
      for (int ks = 0; ks < kTileK / 16; ++ks) {
        uint32_t a[4][4], b[2][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) Ldsm4(a[i], st + TileSwizzle(a_row + 16 * i, 2 * ks + a_chunk));
#pragma unroll
        for (int j = 0; j < 2; ++j) Ldsm4(b[j], bs + TileSwizzle(b_row + 16 * j, 2 * ks + b_chunk));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            MmaBf16(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3], b[j / 2][2 * (j % 2)],
                    b[j / 2][2 * (j % 2) + 1]);
          }
        }
      }
    }
    CopyAsyncWait<0>();
    // Epilogue: C fragment c0, c1 at (gid, 2t + {0, 1}), c2, c3 at (gid + 8, 2t + {0, 1}).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * 64 + 16 * i + 8 * h + gid;
        if (r >= rows) continue;
        const int64_t row = row0 + r;
        if constexpr (kSwiglu) {
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const int64_t col = n0 + (2 * wn + p) * 8 + 2 * t;
            if (col >= n_out) continue;
            StoreSwiglu<kBf16Out>(acc[i][2 * p][2 * h], acc[i][2 * p][2 * h + 1],
                                  acc[i][2 * p + 1][2 * h], acc[i][2 * p + 1][2 * h + 1],
                                  row * n_out + col, y, yb);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t col = n0 + wn * 32 + 8 * j + 2 * t;
            if (col >= n_out) continue;
            *reinterpret_cast<float2*>(y + row * n_out + col) =
                make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          }
        }
      }
    }
  }
}

// Whether GroupedTiled runs on wgmma: where the device runs sm_90a code (ProbeRunningCode; a
// build without it, or another GPU, gets the mma.sync form) unless AFD_MOE_WGMMA=0. Sixteenth
// session, one H200: MoE op at 8192 tokens 2.22 vs 3.14 ms, 8 x 1024 prefill 341.8 vs 283.3
// TFLOP/s (docs/perf.md).
bool TiledWgmma() {
  static const bool off = ChoiceOff("AFD_MOE_WGMMA");
  return !off && ProbeRunningCode().sm90a;
}

// GroupedTiled over m rows in num_local experts (grid sized from host-known m and num_local).
template <bool kSwiglu, bool kBf16Out>
void LaunchTiled(const __nv_bfloat16* x, int64_t m, int64_t k, const void* const* w_ptrs,
                 const int32_t* offsets, int64_t num_local, int64_t n_out, float* y,
                 __nv_bfloat16* yb, cudaStream_t s) {
  const int64_t cols = kSwiglu ? kTileN / 2 : kTileN;
  const dim3 grid(
      static_cast<unsigned>((n_out + cols - 1) / cols),
      static_cast<unsigned>((m + kTileM - 1) / kTileM + (offsets != nullptr ? num_local : 0)));
  const auto go = [&](auto wg) {
    constexpr bool kWg = decltype(wg)::value;
    const auto kernel = GroupedTiled<kSwiglu, kBf16Out, kWg>;
    // wgmma: 1 KB more, so that the stages can start 1024-byte aligned.
    constexpr size_t kSmem = size_t{kTileStages} * kTileStageBytes + (kWg ? 1024 : 0);
    static const bool raised = [&] {
      AFD_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      return true;
    }();
    (void)raised;
    LaunchPdl(kernel, grid, kTileThreads, kSmem, s, x, k, w_ptrs, offsets,
              offsets != nullptr ? num_local : m, n_out, y, yb);
  };
  if (TiledWgmma()) {
    go(std::true_type{});
  } else {
    go(std::false_type{});
  }
}

}  // namespace

// The tiled path's (GroupedTiled): more rows per expert on average, 16-byte rows, even N (pairs
// of outputs per store).
bool TiledFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local) {
  return k % 8 == 0 && n_out % 2 == 0 && m > kMmaMaxAvgRows * num_local &&
         (m + kTileM - 1) / kTileM + num_local <= 65535;  // grid.y
}

void LaunchGroupedTiled(const __nv_bfloat16* x, int64_t m, int64_t k, const void* const* w_ptrs,
                        const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                        bool bf16_out, float* y, __nv_bfloat16* yb, cudaStream_t s) {
  // The forms the dispatch uses: SwiGLU into bf16 (the MLP's first projection), plain into fp32.
  AFD_CHECK(swiglu == bf16_out, "GroupedTiled: SwiGLU goes to bf16, the plain projection to fp32");
  if (swiglu) {
    LaunchTiled<true, true>(x, m, k, w_ptrs, offsets, num_local, n_out, nullptr, yb, s);
  } else {
    LaunchTiled<false, false>(x, m, k, w_ptrs, offsets, num_local, n_out, y, nullptr, s);
  }
}

bool TiledLinearFits(int64_t n, int64_t k, int64_t m) {
  static const bool off = ChoiceOff("AFD_LINEAR_TILED");  // cuBLAS instead
  // Measured on the H200 at 8192 rows: cuBLAS runs N = 576 at ~11 TFLOP/s (tiled: 129), but
  // N = 2048, 3072, 5632, 21888 at 240-520 (tiled: 240-275); so only N off cuBLAS's 128 grid.
  return !off && n >= kTiledLinearMinRows && k % 8 == 0 && m % 2 == 0 && m % kTileN != 0 &&
         (n + kTileM - 1) / kTileM <= 65535;
}

void LaunchTiledLinear(const uint16_t* x_bf16, int64_t n, int64_t k, const void* w, int64_t m,
                       float* y, cudaStream_t s) {
  AFD_CHECK(TiledLinearFits(n, k, m), "TiledLinear: {} rows, K = {}, N = {}", n, k, m);
  LaunchTiled<false, false>(reinterpret_cast<const __nv_bfloat16*>(x_bf16), n, k,
                            static_cast<const void* const*>(w), nullptr, 0, m, y, nullptr, s);
  CheckLaunch("Linear (tiled)");
}

}  // namespace afd::kernels::cuda

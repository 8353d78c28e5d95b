// The grouped expert GEMMs on tensor cores by mma.sync, for decode and mid-sized groups (up to
// kMmaMaxAvgRows rows per expert on average; moe_forms.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
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

// Tensor-core path for bf16 experts at decode and mid-sized groups: mma.sync m16n8k16 (bf16 in,
// fp32 accumulate). x is the bf16 copy of the rows (RowsToBf16), so the results round exactly as
// the other bf16 paths do.
//
// Block: kWarps warps (4 per m tile, 8 per m tile for two tiles: 16 warps share x, one block per
// SM; at batch 256 the gate/up and down GEMMs 0.346 vs 0.359 ms with 8 warps, decode 12.65 vs
// 12.89 ms/step: x staged half as often, in one piece) over one expert's pass of up to
// 16·kTiles rows. The pass's x rows are staged once per block in shared memory (cp.async, in K
// pieces of at most kMmaTileStageBytes per m tile), so x costs the L2 a fraction of the
// weights' traffic (every warp re-reading x through L1 made L2 the limit at batch 256: 90% busy
// at 2.4 TB/s of weights). Weights go straight from global memory into B fragments by 16-byte
// streaming loads (L1 no-allocate), kMmaUnroll 32-wide k chunks in flight per lane before their
// mmas (the first group's loads are issued before the block waits for its x).
//
// A warp owns two 8-column weight tiles of the expert that share every A fragment: SwiGLU, the
// gate rows n0.. and the up rows n_out + n0.. of the same 8 output columns; plain, the columns
// n0.. and n0 + 8.. Each loaded B fragment serves the pass's kTiles m16 tiles (kTiles = 2 when
// experts average over 16 rows: the weights then stream from memory once per 32 rows).
//
// Permuted K: a dot product does not depend on the order of k, so each 32-wide k chunk is fed to
// two m16n8k16 mmas with its k positions permuted so that every lane's operands are 8
// consecutive bf16 (one uint4). PTX ISA fragment layout for m16n8k16 .bf16 (lane = 4 * gid + t):
//   A (16x16, row): a0,a1: row gid,   k = 2t + {0,1}     a2,a3: row gid+8, k = 2t + {0,1}
//                   a4,a5: row gid,   k = 2t + 8 + {0,1} a6,a7: row gid+8, k = 2t + 8 + {0,1}
//   B (16x8, col):  b0,b1: k = 2t + {0,1}, col gid      b2,b3: k = 2t + 8 + {0,1}, col gid
//   C (16x8, f32):  c0,c1: row gid, col 2t + {0,1}      c2,c3: row gid+8, col 2t + {0,1}
// Lane (gid, t) loads W[n0 + gid][k0 + 8t .. +8] = w[0..7] and x[row][k0 + 8t .. +8] = xr[0..7]
// for row = gid and gid + 8 of the m tile; the fragment's k index j maps to chunk position
//   mma #1: j = 2t + {0,1} -> 8t + {0,1},  j = 2t + 8 + {0,1} -> 8t + {2,3}
//   mma #2: j = 2t + {0,1} -> 8t + {4,5},  j = 2t + 8 + {0,1} -> 8t + {6,7}
// a bijection of the chunk's 32 k onto the two mmas' 2 x 16, the same for A and B. So (a .b32
// register holds the lower-indexed element in its low half, as the memory order gives):
//   mma #1: a = {x_gid.x, x_gid8.x, x_gid.y, x_gid8.y}, b = {w.x, w.y}
//   mma #2: a = {x_gid.z, x_gid8.z, x_gid.w, x_gid8.w}, b = {w.z, w.w}
// Shared rows are MmaStride(piece) bf16 apart, ≡ 64 bytes (mod 128): the 8 lanes of a 16-byte
// load phase (rows gid, gid + 1 x 4 t) hit 32 distinct banks. Rows past the expert's segment are
// zeros and never read.
//
// grid: (ceil(n_out / columns per block), row slices, experts: min(num_local, m), see
// ActiveExpert), from host-known m and num_local only (graph-safe; PlanMma); block y takes the
// passes y, y + slices, ... of its expert's rows; blocks past an expert's rows exit at once. Needs
// k % 32 == 0, n_out % 8 == 0 and 16-byte aligned weights and x rows.
constexpr int kMmaUnroll = 8;
// x piece in shared memory per m tile: an SM holds 4 blocks of 1 tile or 2 of 2 tiles.
constexpr int kMmaTileStageBytes = 36 * 1024;

__host__ __device__ constexpr int MmaStride(int piece) {
  return piece + (piece % 64 == 0 ? 32 : 0);
}

__device__ __forceinline__ uint4 LoadStream(const __nv_bfloat16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// A lane's weight fragments of kMmaUnroll chunks, bf16 weights: Load from chunk c (kGuard: the
// last, possibly partial group; chunks past the end are zeros), Chunk(u) chunk u's two uint4
// (j = 0: wa's rows, 1: wb's). The scale arguments are the FP8 form's (Fp8Frags).
struct Bf16Frags {
  uint4 w[kMmaUnroll][2];
  template <bool kGuard>
  __device__ __forceinline__ void Load(const __nv_bfloat16* wa, const __nv_bfloat16* wb,
                                       const float*, const float*, int64_t, int c, int chunks) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      if (!kGuard || c + u < chunks) {
        w[u][0] = LoadStream(wa + (c + u) * 32);
        w[u][1] = LoadStream(wb + (c + u) * 32);
      } else {
        w[u][0] = w[u][1] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  // Chunk u's two fragments (uint4 [2], indexed by tile j).
  __device__ __forceinline__ const uint4 (&Chunk(int u) const)[2] { return w[u]; }
};

// FP8 experts (kFp8): the same kernel reading E4M3 codes -- 8 bytes per lane and 32-wide chunk
// (W[n0 + gid][k0 + 8t .. +8], the bf16 form's k positions) -- with the float32 scale of each
// code's 128 x 128 block (ExpertWeights), turned into the bf16 fragments the bf16 form loads:
// bf16(fp32(code) * scale), rounded to nearest -- the very weights a dequantizing load uploads
// as bf16, so the products, sums and outputs are the bf16 form's bits. A lane's 8 k of a chunk
// lie in one block (32 | 128); its rows' block rows are fixed (8 | 128), so each chunk needs
// one scale per weight tile, loaded with the codes.
__device__ __forceinline__ uint2 LoadStream8(const uint8_t* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];"
      : "=r"(v.x), "=r"(v.y)
      : "l"(p));
  return v;
}

// Two E4M3 codes (the low byte first) times scale as a bf16 pair (low half: the first).
__device__ __forceinline__ uint32_t Fp8PairToBf16(uint32_t two, float scale) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Eight codes (memory order) as the uint4 of eight bf16 the bf16 form loads.
__device__ __forceinline__ uint4 Fp8x8ToBf16(uint2 q, float scale) {
  return make_uint4(Fp8PairToBf16(q.x, scale), Fp8PairToBf16(q.x >> 16, scale),
                    Fp8PairToBf16(q.y, scale), Fp8PairToBf16(q.y >> 16, scale));
}

// Fp8Frags: Bf16Frags for FP8 codes -- their bytes and scales loaded (sa / sb: this lane's
// rows' block rows of scales; kb: the k of chunk 0, the piece's start), each chunk's bf16
// fragments made by Chunk just before its mmas.
struct Fp8Frags {
  uint2 q[kMmaUnroll][2];
  float sc[kMmaUnroll][2];
  template <bool kGuard>
  __device__ __forceinline__ void Load(const uint8_t* wa, const uint8_t* wb, const float* sa,
                                       const float* sb, int64_t kb, int c, int chunks) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      if (!kGuard || c + u < chunks) {
        q[u][0] = LoadStream8(wa + (c + u) * 32);
        q[u][1] = LoadStream8(wb + (c + u) * 32);
        const int64_t block = (kb + (c + u) * 32) >> 7;
        sc[u][0] = __ldg(sa + block);
        sc[u][1] = __ldg(sb + block);
      } else {
        q[u][0] = q[u][1] = make_uint2(0, 0);
        sc[u][0] = sc[u][1] = 0.0f;
      }
    }
  }
  struct Pair {
    uint4 v[2];
    __device__ __forceinline__ const uint4& operator[](int j) const { return v[j]; }
  };
  __device__ __forceinline__ Pair Chunk(int u) const {
    return {{Fp8x8ToBf16(q[u][0], sc[u][0]), Fp8x8ToBf16(q[u][1], sc[u][1])}};
  }
};

// Per chunk and m tile: the x fragments from shared memory (xr: this lane's rows gid, gid + 8 of
// each tile, null past the pass) and the 4 mmas, with the loaded weight fragments f.
template <bool kGuard, int kTiles, typename Frags>
__device__ __forceinline__ void MmaCompute(const Frags& f,
                                           const __nv_bfloat16* const (&xr)[kTiles][2], int c,
                                           int chunks, int tiles, float (&acc)[kTiles][2][4]) {
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) {
    if (kGuard && c + u >= chunks) break;
    const auto& w = f.Chunk(u);  // FP8: converted once per chunk (the tiles share it)
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (i >= tiles) break;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const int off = (c + u) * 32;
      const uint4 lo = xr[i][0] ? *reinterpret_cast<const uint4*>(xr[i][0] + off) : zero;
      const uint4 hi = xr[i][1] ? *reinterpret_cast<const uint4*>(xr[i][1] + off) : zero;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        MmaBf16(acc[i][j], lo.x, hi.x, lo.y, hi.y, w[j].x, w[j].y);
        MmaBf16(acc[i][j], lo.z, hi.z, lo.w, hi.w, w[j].z, w[j].w);
      }
    }
  }
}

// The expert of block z: z itself when the grid spans every local expert, else (grid z =
// min(num_local, rows): decode's few rows use a few experts) the z-th expert with rows,
// ascending (-1: fewer have rows), so no block is launched for each unused expert (at batch 1,
// 58 of 64 experts' blocks did nothing but start and exit). Scans up to kMaxActiveScanExperts;
// every thread of the block must call it.
constexpr int kActiveScanRounds = 8;
constexpr int64_t kMaxActiveScanExperts = 32 * kActiveScanRounds;
__device__ __forceinline__ int64_t ActiveExpert(const int32_t* offsets, int64_t num_local) {
  if (gridDim.z == num_local) return blockIdx.z;
  __shared__ int found;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    bool has[kActiveScanRounds];
#pragma unroll
    for (int r = 0; r < kActiveScanRounds; ++r) {  // every load issued before any is used
      const int64_t e = 32 * r + lane;
      has[r] = e < num_local && offsets[e + 1] > offsets[e];
    }
    int seen = 0, pick = -1;
    const int z = static_cast<int>(blockIdx.z);
#pragma unroll
    for (int r = 0; r < kActiveScanRounds; ++r) {
      const unsigned mask = __ballot_sync(0xffffffffu, has[r]);
      const unsigned who =
          __ballot_sync(0xffffffffu, has[r] && seen + __popc(mask & ((1u << lane) - 1)) == z);
      if (who != 0) pick = 32 * r + __ffs(who) - 1;
      seen += __popc(mask);
    }
    if (lane == 0) found = pick;
  }
  __syncthreads();
  return found;
}

// kBf16Out (SwiGLU only): the products are written as bf16 to yb (rounded as RowsToBf16 rounds
// them: the next GEMM's input) instead of fp32 to y. piece: the K piece staged at a time (a
// multiple of 32; PlanMma).
// kHalves == 2 (one m tile, K in more than one piece: decode's few rows per expert): the block's
// warps are two halves over the same columns, half h taking pieces h, h + 2, ... (both pieces of a
// round staged at once), so each warp's chain of dependent weight loads is half as long; half 1
// hands its sums to half 0 through shared memory, which adds them (sum = half 0 + half 1) and
// stores. The sum order then differs from kHalves == 1 in the last bits.
// kFp8: the weights are E4M3 codes with block scales (s_ptrs[e]: the expert's scales, rows of
// ceil(k / 128); SwiGLU's up rows from block row ceil(n_out / 128) on), see Fp8Frags.
template <bool kSwiglu, bool kBf16Out, int kTiles, int kHalves = 1,
          int kWarps = 4 * kTiles* kHalves, bool kFp8 = false>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)  // 128 registers
    GroupedMma(const __nv_bfloat16* x, int64_t k, int piece, const void* const* w_ptrs,
               const void* const* s_ptrs, const int32_t* offsets, int64_t num_local, int64_t n_out,
               float* y, __nv_bfloat16* yb) {
  PdlStart();
  static_assert(kHalves == 1 || kTiles == 1, "halves only with one m tile");
  extern __shared__ uint4 stage4[];
  auto* xs = reinterpret_cast<__nv_bfloat16*>(stage4);  // [kHalves][16 kTiles][MmaStride(piece)]
  constexpr int kPassRows = 16 * kTiles, kColWarps = kWarps / kHalves;
  const int64_t e = ActiveExpert(offsets, num_local);
  if (e < 0) return;  // the whole block
  const int64_t r_end = offsets[e + 1];
  const int64_t first = offsets[e] + int64_t(blockIdx.y) * kPassRows;
  if (first >= r_end) return;  // the whole block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, t = lane & 3;
  const int half = warp / kColWarps, cw = warp % kColWarps;
  const int64_t n0 = (int64_t(blockIdx.x) * kColWarps + cw) * (kSwiglu ? 8 : 16);
  const bool active = n0 < n_out;  // idle warps past n_out still stage x and meet the barriers
  // Plain with n_out % 16 == 8: the last warp's second tile is past n_out; it re-reads the
  // first tile and its outputs are dropped.
  const bool second = kSwiglu || n0 + 8 < n_out;
  using W = std::conditional_t<kFp8, uint8_t, __nv_bfloat16>;
  const auto* w = static_cast<const W*>(w_ptrs[e]);
  const W* wa = w + (n0 + gid) * k + t * 8;
  const W* wb = w + ((kSwiglu ? n_out + n0 : (second ? n0 + 8 : n0)) + gid) * k + t * 8;
  // kFp8: the scale rows of this lane's weight rows (the tile's 8 rows share one block row).
  const float* sa = nullptr;
  const float* sb = nullptr;
  if constexpr (kFp8) {
    const auto* sw = static_cast<const float*>(s_ptrs[e]);
    const int64_t kblocks = (k + 127) / 128;
    const int64_t ra = (n0 + gid) / 128;
    const int64_t rb =
        kSwiglu ? (n_out + 127) / 128 + (n0 + gid) / 128 : ((second ? n0 + 8 : n0) + gid) / 128;
    sa = sw + ra * kblocks;
    sb = sw + rb * kblocks;
  }
  const int stride = MmaStride(piece);
  const __nv_bfloat16* my_xs = xs + half * kPassRows * stride;
  for (int64_t p0 = first; p0 < r_end; p0 += int64_t(gridDim.y) * kPassRows) {
    const int rows = static_cast<int>(min(static_cast<int64_t>(kPassRows), r_end - p0));
    const int tiles = (rows + 15) / 16;
    const __nv_bfloat16* xr[kTiles][2];  // this lane's rows gid, gid + 8 of each m tile
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = 16 * i + 8 * h + gid;
        xr[i][h] = rr < rows ? my_xs + rr * stride + t * 8 : nullptr;
      }
    }
    float acc[kTiles][2][4] = {};
    for (int64_t kr = 0; kr < k; kr += int64_t(kHalves) * piece) {
      __syncthreads();  // the previous round's pieces are consumed
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const int64_t kb = kr + int64_t(h) * piece;
        if (kb >= k) break;
        const int vecs = static_cast<int>(min(static_cast<int64_t>(piece), k - kb)) / 8;
        __nv_bfloat16* dst = xs + h * kPassRows * stride;
        for (int i = threadIdx.x; i < rows * vecs; i += kWarps * 32) {
          const int r = i / vecs, v = i - r * vecs;
          CopyAsync16(dst + r * stride + 8 * v, x + (p0 + r) * k + kb + 8 * v);
        }
      }
      const int64_t kb = kr + int64_t(half) * piece;
      const int kn = kb < k ? static_cast<int>(min(static_cast<int64_t>(piece), k - kb)) : 0;
      const int chunks = kn / 32;
      // The first weight group's loads are in flight while x lands.
      std::conditional_t<kFp8, Fp8Frags, Bf16Frags> f;
      if (active && chunks > 0) {
        if (chunks >= kMmaUnroll) {
          f.template Load<false>(wa + kb, wb + kb, sa, sb, kb, 0, chunks);
        } else {
          f.template Load<true>(wa + kb, wb + kb, sa, sb, kb, 0, chunks);
        }
      }
      CopyAsyncWaitAll();
      __syncthreads();
      if (!active) continue;
      for (int c = 0; c < chunks; c += kMmaUnroll) {
        if (c > 0) {
          if (c + kMmaUnroll <= chunks) {
            f.template Load<false>(wa + kb, wb + kb, sa, sb, kb, c, chunks);
          } else {
            f.template Load<true>(wa + kb, wb + kb, sa, sb, kb, c, chunks);
          }
        }
        if (c + kMmaUnroll <= chunks) {
          MmaCompute<false>(f, xr, c, chunks, tiles, acc);
        } else {
          MmaCompute<true>(f, xr, c, chunks, tiles, acc);
        }
      }
    }
    if constexpr (kHalves == 2) {
      // Half 1's sums to half 0 (the stage is free once every warp is past its last piece).
      float* red = reinterpret_cast<float*>(stage4);  // [kColWarps][32 lanes][8]
      __syncthreads();
      if (half == 1 && active) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          reinterpret_cast<float4*>(red)[(cw * 32 + lane) * 2 + j] =
              make_float4(acc[0][j][0], acc[0][j][1], acc[0][j][2], acc[0][j][3]);
        }
      }
      __syncthreads();
      if (half == 1 || !active) continue;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float4 o = reinterpret_cast<const float4*>(red)[(cw * 32 + lane) * 2 + j];
        acc[0][j][0] += o.x;
        acc[0][j][1] += o.y;
        acc[0][j][2] += o.z;
        acc[0][j][3] += o.w;
      }
    }
    if (!active) continue;
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (i >= tiles) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = 16 * i + 8 * h + gid;
        if (rr >= rows) continue;
        const int64_t at = (p0 + rr) * n_out + n0 + 2 * t;
        float* yr = kBf16Out ? nullptr : y + at;
        const float g0 = acc[i][0][2 * h], g1 = acc[i][0][2 * h + 1];
        if (kSwiglu) {
          const float u0 = acc[i][1][2 * h], u1 = acc[i][1][2 * h + 1];
          const float2 a = make_float2(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
          if constexpr (kBf16Out) {
            *reinterpret_cast<__nv_bfloat162*>(yb + at) = __floats2bfloat162_rn(a.x, a.y);
          } else {
            *reinterpret_cast<float2*>(yr) = a;
          }
        } else {
          *reinterpret_cast<float2*>(yr) = make_float2(g0, g1);
          if (second) {
            *reinterpret_cast<float2*>(yr + 8) =
                make_float2(acc[i][1][2 * h], acc[i][1][2 * h + 1]);
          }
        }
      }
    }
  }
}

// The mma path's launch for m rows of x [m, k] against n_out weight rows per expert: m tiles per
// pass (2 when experts average over 16 rows), the K piece staged at a time in shared memory
// (equal pieces, multiples of 32, each fitting kMmaTileStageBytes per m tile), the grid (column
// tiles x row slices x experts) and the shared memory bytes.
// Two m tiles run 16 warps a block: one block per SM, twice the x stage per tile.
struct MmaLaunch {
  int tiles, halves, warps, piece;
  dim3 grid;
  size_t smem;
};

MmaLaunch PlanMma(int64_t m, int64_t k, int64_t n_out, bool swiglu, int64_t num_local) {
  MmaLaunch p{};
  const int64_t avg_rows = (m + num_local - 1) / num_local;
  p.tiles = avg_rows > 16 ? 2 : 1;
  // Two m tiles: 16 warps a block, one block per SM (twice the columns per block, so x is
  // staged half as often; K in one piece up to 2272).
  const bool wide = p.tiles == 2;
  const int64_t pass_rows = 16 * p.tiles;
  const int64_t max_piece = ((wide ? 2 : 1) * kMmaTileStageBytes / 32 - 32) / 32 * 32;
  const int64_t pieces = (k + max_piece - 1) / max_piece;
  p.piece = static_cast<int>((k / 32 + pieces - 1) / pieces * 32);
  // One m tile over more than one piece: two halves of warps over K (GroupedMma, kHalves).
  p.halves = p.tiles == 1 && pieces > 1 ? 2 : 1;
  p.smem = static_cast<size_t>(p.halves * pass_rows) * MmaStride(p.piece) * sizeof(__nv_bfloat16);
  p.warps = (wide ? 8 : 4) * p.tiles * p.halves;
  // Experts: at most m have rows (ActiveExpert maps z to the z-th of them).
  const int64_t experts = num_local <= kMaxActiveScanExperts ? std::min(num_local, m) : num_local;
  const int64_t cols = p.warps / p.halves * (swiglu ? 8 : 16);
  // Row slices: one pass each for up to 16 rows per expert on average; above, twice the average
  // passes, so that an expert over its share runs its extra passes side by side, not after
  // (blocks of a slice past an expert's rows exit at once).
  const int64_t avg_passes = (m + pass_rows * num_local - 1) / (pass_rows * num_local);
  p.grid = dim3(static_cast<unsigned>((n_out + cols - 1) / cols),
                static_cast<unsigned>(p.tiles == 1 ? 1 : 2 * avg_passes),
                static_cast<unsigned>(experts));
  return p;
}

// GroupedMma with its plan: y (fp32) or, kBf16Out, yb (bf16); kFp8: s_ptrs the scales.
template <bool kSwiglu, bool kBf16Out, bool kFp8>
void LaunchMma(const __nv_bfloat16* x, int64_t m, int64_t k, const void* const* w_ptrs,
               const void* const* s_ptrs, const int32_t* offsets, int64_t num_local, int64_t n_out,
               float* y, __nv_bfloat16* yb, cudaStream_t s) {
  const MmaLaunch p = PlanMma(m, k, n_out, kSwiglu, num_local);
  const auto go = [&](auto tiles, auto halves, auto wide) {
    constexpr int kTiles = decltype(tiles)::value, kHalves = decltype(halves)::value;
    constexpr int kWide = decltype(wide)::value;  // 1 + (16 warps, twice the stage per tile)
    const auto kernel =
        GroupedMma<kSwiglu, kBf16Out, kTiles, kHalves, 4 * kTiles * kHalves * kWide, kFp8>;
    // The opt-in above 48 KB, once per instance (this lambda is instantiated per plan shape).
    static const bool raised = [&] {
      AFD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          kWide * kHalves * kTiles * kMmaTileStageBytes));
      return true;
    }();
    (void)raised;
    LaunchPdl(kernel, p.grid, p.warps * 32, p.smem, s, x, k, p.piece, w_ptrs, s_ptrs, offsets,
              num_local, n_out, y, yb);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (p.tiles == 2) {
    go(Two{}, One{}, Two{});
  } else if (p.halves == 2) {
    go(One{}, Two{}, One{});
  } else {
    go(One{}, One{}, One{});
  }
}

}  // namespace

// The mma.sync path's shapes: K in 32-wide chunks, N in 8-column tiles, at most
// kMmaMaxAvgRows rows per expert on average.
bool MmaFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local, bool any_rows) {
  return k % 32 == 0 && n_out % 8 == 0 && (any_rows || m <= kMmaMaxAvgRows * num_local);
}

void LaunchGroupedMma(const __nv_bfloat16* x, int64_t m, int64_t k, const void* const* w_ptrs,
                      const void* const* s_ptrs, const int32_t* offsets, int64_t num_local,
                      int64_t n_out, bool swiglu, bool bf16_out, float* y, __nv_bfloat16* yb,
                      cudaStream_t s) {
  // The forms the dispatch uses: SwiGLU into fp32 or bf16, plain into fp32; bf16 or FP8 weights.
  const auto go = [&](auto fp8) {
    constexpr bool kFp8 = decltype(fp8)::value;
    if (swiglu && bf16_out) {
      LaunchMma<true, true, kFp8>(x, m, k, w_ptrs, s_ptrs, offsets, num_local, n_out, nullptr, yb,
                                  s);
    } else if (swiglu) {
      LaunchMma<true, false, kFp8>(x, m, k, w_ptrs, s_ptrs, offsets, num_local, n_out, y, nullptr,
                                   s);
    } else {
      AFD_CHECK(!bf16_out, "GroupedMma: a bf16 output is for the SwiGLU projection only");
      LaunchMma<false, false, kFp8>(x, m, k, w_ptrs, s_ptrs, offsets, num_local, n_out, y, nullptr,
                                    s);
    }
  };
  if (s_ptrs != nullptr) {
    go(std::true_type{});
  } else {
    go(std::false_type{});
  }
}

}  // namespace afd::kernels::cuda

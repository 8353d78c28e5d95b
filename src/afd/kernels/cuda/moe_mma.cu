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

__device__ __forceinline__ uint4 LoadStream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 LoadStream8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];"
      : "=r"(v.x), "=r"(v.y)
      : "l"(p));
  return v;
}

// A lane's weight fragments of kMmaUnroll chunks, bf16 weights: Load from chunk c (kGuard: the
// last, possibly partial group; chunks past the end are zeros), w[u][j] chunk u's uint4 (j = 0:
// wa's rows, 1: wb's). The scale arguments are the FP8 form's (Fp8Frags).
struct Bf16Frags {
  static constexpr int kChunk = 32;  // k per chunk: 8 bf16 per lane
  static constexpr int kUnroll = kMmaUnroll;
  uint4 w[kMmaUnroll][2];
  template <bool kGuard>
  __device__ __forceinline__ void Load(const __nv_bfloat16* wa, const __nv_bfloat16* wb,
                                       const float*, const float*, int64_t, int c, int chunks) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      if (!kGuard || c + u < chunks) {
        w[u][0] = LoadStream(wa + (c + u) * kChunk);
        w[u][1] = LoadStream(wb + (c + u) * kChunk);
      } else {
        w[u][0] = w[u][1] = make_uint4(0, 0, 0, 0);
      }
    }
  }
};

// FP8 experts (kFp8): E4M3 weights with a float32 scale per 128 x 128 block (ExpertWeights)
// times E4M3 rows with a float32 scale per row and group of 128 (RowsToFp8: the AFD dispatch's
// rules, common/fp8_rows.h), on the e4m3 mma (m16n8k32, fp32 accumulate) -- the codes go to the
// tensor cores as they are (no conversion), as DeepGEMM's w8a8. The same permuted-K layout with
// 64-wide chunks: lane (gid, t) loads the 16 codes W[n0 + gid][k0 + 16t .. +16] (one uint4,
// w.x .. w.w four codes each) and x[row][k0 + 16t .. +16] from shared memory; by the m16n8k32
// fragment layout (mma.cuh) the fragment k index j maps to chunk position
//   mma #1: j = 4t + {0..3} -> 16t + {0..3},   j = 4t + 16 + {0..3} -> 16t + 4 + {0..3}
//   mma #2: j = 4t + {0..3} -> 16t + 8 + {0..3}, j = 4t + 16 + {0..3} -> 16t + 12 + {0..3}
// so mma #1: a = {x_gid.x, x_gid8.x, x_gid.y, x_gid8.y}, b = {w.x, w.y}; #2 the .z, .w words --
// the bf16 form's register pattern. Each chunk's two mmas sum into a fresh accumulator that is
// then added to the output sums times x's scale (the row's) and W's (the tile's: its 8 rows lie
// in one block row; 64 | 128, so a chunk lies in one block): fp32 sums every 64 products, as
// DeepGEMM promotes every 128. A trailing 32-wide chunk (k % 64 == 32) takes one mma from 8
// codes a lane (W[..][k0 + 8t .. +8]: j = 4t + {0..3} -> 8t + {0..3}, 4t + 16 + {0..3} ->
// 8t + 4 + {0..3}).
// kUnroll chunks a group (even: whole 128-blocks); 4 with two m tiles (8 spilled: the second
// tile's sums take the registers).
template <int kGroup>
struct Fp8Frags {
  static constexpr int kChunk = 64;  // k per chunk: 16 codes per lane
  static constexpr int kUnroll = kGroup;
  static_assert(kUnroll % 2 == 0, "Fp8Frags: a group is whole 128-blocks");
  uint4 w[kUnroll][2];
  float sc[kUnroll / 2][2];  // W's scales of the group's 128-blocks (two chunks each)
  // kb: the k of chunk 0 (a multiple of 128: PlanMma's pieces).
  template <bool kGuard>
  __device__ __forceinline__ void Load(const uint8_t* wa, const uint8_t* wb, const float* sa,
                                       const float* sb, int64_t kb, int c, int chunks) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!kGuard || c + u < chunks) {
        w[u][0] = LoadStream(wa + (c + u) * kChunk);
        w[u][1] = LoadStream(wb + (c + u) * kChunk);
      } else {
        w[u][0] = w[u][1] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int v = 0; v < kUnroll / 2; ++v) {
      if (!kGuard || c + 2 * v < chunks) {
        const int64_t block = (kb >> 7) + (c >> 1) + v;
        sc[v][0] = __ldg(sa + block);
        sc[v][1] = __ldg(sb + block);
      } else {
        sc[v][0] = sc[v][1] = 0.0f;
      }
    }
  }
};

// Per chunk and m tile: the x fragments from shared memory (xr: this lane's rows gid, gid + 8 of
// each tile, null past the pass) and the 4 mmas, with the loaded weight fragments f.
template <bool kGuard, int kTiles>
__device__ __forceinline__ void MmaCompute(const Bf16Frags& f,
                                           const __nv_bfloat16* const (&xr)[kTiles][2],
                                           const float*, int, int c, int chunks, int tiles,
                                           float (&acc)[kTiles][2][4]) {
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) {
    if (kGuard && c + u >= chunks) break;
    const uint4(&w)[2] = f.w[u];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (i >= tiles) break;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const int off = (c + u) * Bf16Frags::kChunk;
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

// acc += d · (x's scale · W's), rows gid (d[0], d[1]) and gid + 8 (d[2], d[3]).
__device__ __forceinline__ void Promote(float (&acc)[4], const float (&d)[4], float lo, float hi) {
  acc[0] = fmaf(d[0], lo, acc[0]);
  acc[1] = fmaf(d[1], lo, acc[1]);
  acc[2] = fmaf(d[2], hi, acc[2]);
  acc[3] = fmaf(d[3], hi, acc[3]);
}

// The FP8 form's: sg the x scales of row gid's 128-blocks in the piece (row r's at
// sg + (r - gid) * nb).
template <bool kGuard, int kTiles, int kGroup>
__device__ __forceinline__ void MmaCompute(const Fp8Frags<kGroup>& f,
                                           const uint8_t* const (&xr)[kTiles][2], const float* sg,
                                           int nb, int c, int chunks, int tiles,
                                           float (&acc)[kTiles][2][4]) {
#pragma unroll
  for (int u = 0; u < kGroup; ++u) {
    if (kGuard && c + u >= chunks) break;
    const uint4(&w)[2] = f.w[u];
    const int block = (c + u) >> 1;  // in the piece
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (i >= tiles) break;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const int off = (c + u) * Fp8Frags<kGroup>::kChunk;
      const uint4 lo = xr[i][0] ? *reinterpret_cast<const uint4*>(xr[i][0] + off) : zero;
      const uint4 hi = xr[i][1] ? *reinterpret_cast<const uint4*>(xr[i][1] + off) : zero;
      const float s_lo = xr[i][0] ? sg[16 * i * nb + block] : 0.0f;
      const float s_hi = xr[i][1] ? sg[(16 * i + 8) * nb + block] : 0.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float d[4] = {};
        MmaFp8(d, lo.x, hi.x, lo.y, hi.y, w[j].x, w[j].y);
        MmaFp8(d, lo.z, hi.z, lo.w, hi.w, w[j].z, w[j].w);
        const float sw = f.sc[u >> 1][j];
        Promote(acc[i][j], d, s_lo * sw, s_hi * sw);
      }
    }
  }
}

// The FP8 form's trailing 32-wide chunk at piece offset off (k % 64 == 32): wa / wb / xr point
// at this lane's 16-code run of chunk 0 (16t), the chunk's 8 codes a lane start at 8t.
template <int kTiles>
__device__ __forceinline__ void MmaTailFp8(const uint8_t* wa, const uint8_t* wb, const float* sa,
                                           const float* sb, int64_t kb, int off, int t,
                                           const uint8_t* const (&xr)[kTiles][2], const float* sg,
                                           int nb, int tiles, float (&acc)[kTiles][2][4]) {
  const int back = off - 8 * t;  // 16t + off - 8t = off + 8t
  const uint2 w[2] = {LoadStream8(wa + back), LoadStream8(wb + back)};
  const int64_t wblock = (kb + off) >> 7;
  const float sw[2] = {__ldg(sa + wblock), __ldg(sb + wblock)};
  const int block = off >> 7;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    if (i >= tiles) break;
    const uint2 zero = make_uint2(0, 0);
    const uint2 lo = xr[i][0] ? *reinterpret_cast<const uint2*>(xr[i][0] + back) : zero;
    const uint2 hi = xr[i][1] ? *reinterpret_cast<const uint2*>(xr[i][1] + back) : zero;
    const float s_lo = xr[i][0] ? sg[16 * i * nb + block] : 0.0f;
    const float s_hi = xr[i][1] ? sg[(16 * i + 8) * nb + block] : 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float d[4] = {};
      MmaFp8(d, lo.x, hi.x, lo.y, hi.y, w[j].x, w[j].y);
      Promote(acc[i][j], d, s_lo * sw[j], s_hi * sw[j]);
    }
  }
}

// The FP8 form's shared row of x codes: ≡ 64 bytes (mod 128), as MmaStride's, 16-byte aligned.
__host__ __device__ constexpr int Fp8Stride(int piece) { return (piece + 127) / 128 * 128 + 64; }
__host__ __device__ constexpr int Fp8Blocks(int piece) { return (piece + 127) / 128; }

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
// ceil(k / 128); SwiGLU's up rows from block row ceil(n_out / 128) on), x E4M3 codes [m, k] with
// x_scales [m, ceil(k / 128)] (Fp8Frags); fp32 out only.
template <bool kSwiglu, bool kBf16Out, int kTiles, int kHalves = 1,
          int kWarps = 4 * kTiles* kHalves, bool kFp8 = false>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)  // 128 registers
    GroupedMma(const void* xv, const float* x_scales, int64_t k, int piece,
               const void* const* w_ptrs, const void* const* s_ptrs, const int32_t* offsets,
               int64_t num_local, int64_t n_out, float* y, __nv_bfloat16* yb) {
  PdlStart();
  static_assert(kHalves == 1 || kTiles == 1, "halves only with one m tile");
  static_assert(!kFp8 || !kBf16Out, "the FP8 form writes fp32");
  using X = std::conditional_t<kFp8, uint8_t, __nv_bfloat16>;  // x and W elements
  using Frags = std::conditional_t<kFp8, Fp8Frags<kTiles == 1 ? 6 : 4>, Bf16Frags>;
  constexpr int kGroup = Frags::kUnroll;
  constexpr int kChunk = Frags::kChunk;
  constexpr int kVec = 16 / sizeof(X);  // elements of a 16-byte copy
  const X* x = static_cast<const X*>(xv);
  extern __shared__ uint4 stage4[];
  // [kHalves][16 kTiles][stride] x elements; kFp8: then [kHalves][16 kTiles][Fp8Blocks] scales.
  auto* xs = reinterpret_cast<X*>(stage4);
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
  const auto* w = static_cast<const X*>(w_ptrs[e]);
  const X* wa = w + (n0 + gid) * k + t * kVec;
  const X* wb = w + ((kSwiglu ? n_out + n0 : (second ? n0 + 8 : n0)) + gid) * k + t * kVec;
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
  const int stride = kFp8 ? Fp8Stride(piece) : MmaStride(piece);
  const int nblocks = kFp8 ? Fp8Blocks(piece) : 0;  // x scales per staged row
  auto* ss = reinterpret_cast<float*>(xs + kHalves * kPassRows * stride);
  const X* my_xs = xs + half * kPassRows * stride;
  const float* my_ss = ss + half * kPassRows * nblocks;
  for (int64_t p0 = first; p0 < r_end; p0 += int64_t(gridDim.y) * kPassRows) {
    const int rows = static_cast<int>(min(static_cast<int64_t>(kPassRows), r_end - p0));
    const int tiles = (rows + 15) / 16;
    const X* xr[kTiles][2];  // this lane's rows gid, gid + 8 of each m tile
    const float* sg = kFp8 ? my_ss + gid * nblocks : nullptr;  // kFp8: row gid's scales
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = 16 * i + 8 * h + gid;
        xr[i][h] = rr < rows ? my_xs + rr * stride + t * kVec : nullptr;
      }
    }
    float acc[kTiles][2][4] = {};
    for (int64_t kr = 0; kr < k; kr += int64_t(kHalves) * piece) {
      __syncthreads();  // the previous round's pieces are consumed
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const int64_t kb = kr + int64_t(h) * piece;
        if (kb >= k) break;
        const int kn = static_cast<int>(min(static_cast<int64_t>(piece), k - kb));
        const int vecs = kn / kVec;
        X* dst = xs + h * kPassRows * stride;
        for (int i = threadIdx.x; i < rows * vecs; i += kWarps * 32) {
          const int r = i / vecs, v = i - r * vecs;
          CopyAsync16(dst + r * stride + kVec * v, x + (p0 + r) * k + kb + kVec * v);
        }
        if constexpr (kFp8) {
          const int nb = Fp8Blocks(kn);
          const int64_t kg = (k + 127) / 128;
          float* sdst = ss + h * kPassRows * nblocks;
          for (int i = threadIdx.x; i < rows * nb; i += kWarps * 32) {
            const int r = i / nb, b = i - r * nb;
            CopyAsync4(sdst + r * nblocks + b, x_scales + (p0 + r) * kg + (kb >> 7) + b);
          }
        }
      }
      const int64_t kb = kr + int64_t(half) * piece;
      const int kn = kb < k ? static_cast<int>(min(static_cast<int64_t>(piece), k - kb)) : 0;
      const int chunks = kn / kChunk;  // kFp8: and a 32-wide tail when kn % 64 == 32
      // The first weight group's loads are in flight while x lands.
      Frags f;
      if (active && chunks > 0) {
        if (chunks >= kGroup) {
          f.template Load<false>(wa + kb, wb + kb, sa, sb, kb, 0, chunks);
        } else {
          f.template Load<true>(wa + kb, wb + kb, sa, sb, kb, 0, chunks);
        }
      }
      CopyAsyncWaitAll();
      __syncthreads();
      if (!active) continue;
      for (int c = 0; c < chunks; c += kGroup) {
        if (c > 0) {
          if (c + kGroup <= chunks) {
            f.template Load<false>(wa + kb, wb + kb, sa, sb, kb, c, chunks);
          } else {
            f.template Load<true>(wa + kb, wb + kb, sa, sb, kb, c, chunks);
          }
        }
        if (c + kGroup <= chunks) {
          MmaCompute<false>(f, xr, sg, nblocks, c, chunks, tiles, acc);
        } else {
          MmaCompute<true>(f, xr, sg, nblocks, c, chunks, tiles, acc);
        }
      }
      if constexpr (kFp8) {
        if (kn % kChunk != 0) {
          MmaTailFp8(wa + kb, wb + kb, sa, sb, kb, chunks * kChunk, t, xr, sg, nblocks, tiles, acc);
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
// (equal pieces, multiples of 32 -- fp8: of 128, whole scale blocks -- each fitting
// kMmaTileStageBytes per m tile), the grid (column tiles x row slices x experts) and the shared
// memory bytes.
// Two m tiles run 16 warps a block: one block per SM, twice the x stage per tile.
struct MmaLaunch {
  int tiles, halves, warps, piece;
  dim3 grid;
  size_t smem;
};

MmaLaunch PlanMma(int64_t m, int64_t k, int64_t n_out, bool swiglu, int64_t num_local, bool fp8) {
  MmaLaunch p{};
  const int64_t avg_rows = (m + num_local - 1) / num_local;
  p.tiles = avg_rows > 16 ? 2 : 1;
  // Two m tiles: 16 warps a block, one block per SM (twice the columns per block, so x is
  // staged half as often; K in one piece up to 2272 bf16, 4352 fp8).
  const bool wide = p.tiles == 2;
  const int64_t pass_rows = 16 * p.tiles;
  // A staged row's bytes: the block's stage (kWide x kTiles x kMmaTileStageBytes, the opt-in of
  // LaunchMma) over its 16 x kTiles rows: 2304, 4608 wide.
  const int64_t row_bytes = (wide ? 2 : 1) * kMmaTileStageBytes / 16;
  if (fp8) {
    // A row's codes (Fp8Stride) and its scales per 128-block.
    int64_t max_piece = row_bytes / 128 * 128;
    while (Fp8Stride(static_cast<int>(max_piece)) + 4 * Fp8Blocks(static_cast<int>(max_piece)) >
           row_bytes) {
      max_piece -= 128;
    }
    const int64_t blocks = (k + 127) / 128;
    const int64_t pieces = (blocks * 128 + max_piece - 1) / max_piece;
    p.piece = static_cast<int>((blocks + pieces - 1) / pieces * 128);
    p.halves = p.tiles == 1 && pieces > 1 ? 2 : 1;
    p.smem =
        static_cast<size_t>(p.halves * pass_rows) * (Fp8Stride(p.piece) + 4 * Fp8Blocks(p.piece));
  } else {
    const int64_t max_piece = (row_bytes / 2 - 32) / 32 * 32;
    const int64_t pieces = (k + max_piece - 1) / max_piece;
    p.piece = static_cast<int>((k / 32 + pieces - 1) / pieces * 32);
    // One m tile over more than one piece: two halves of warps over K (GroupedMma, kHalves).
    p.halves = p.tiles == 1 && pieces > 1 ? 2 : 1;
    p.smem = static_cast<size_t>(p.halves * pass_rows) * MmaStride(p.piece) * sizeof(__nv_bfloat16);
  }
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

// GroupedMma with its plan: y (fp32) or, kBf16Out, yb (bf16); kFp8: x codes with x_scales,
// s_ptrs the weights' scales.
template <bool kSwiglu, bool kBf16Out, bool kFp8>
void LaunchMma(const void* x, const float* x_scales, int64_t m, int64_t k,
               const void* const* w_ptrs, const void* const* s_ptrs, const int32_t* offsets,
               int64_t num_local, int64_t n_out, float* y, __nv_bfloat16* yb, cudaStream_t s) {
  const MmaLaunch p = PlanMma(m, k, n_out, kSwiglu, num_local, kFp8);
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
    LaunchPdl(kernel, p.grid, p.warps * 32, p.smem, s, x, x_scales, k, p.piece, w_ptrs, s_ptrs,
              offsets, num_local, n_out, y, yb);
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
                      const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                      bool bf16_out, float* y, __nv_bfloat16* yb, cudaStream_t s) {
  // The forms the dispatch uses: SwiGLU into fp32 or bf16, plain into fp32.
  if (swiglu && bf16_out) {
    LaunchMma<true, true, false>(x, nullptr, m, k, w_ptrs, nullptr, offsets, num_local, n_out,
                                 nullptr, yb, s);
  } else if (swiglu) {
    LaunchMma<true, false, false>(x, nullptr, m, k, w_ptrs, nullptr, offsets, num_local, n_out, y,
                                  nullptr, s);
  } else {
    AFD_CHECK(!bf16_out, "GroupedMma: a bf16 output is for the SwiGLU projection only");
    LaunchMma<false, false, false>(x, nullptr, m, k, w_ptrs, nullptr, offsets, num_local, n_out, y,
                                   nullptr, s);
  }
}

void LaunchGroupedMmaFp8(const uint8_t* xq, const float* x_scales, int64_t m, int64_t k,
                         const void* const* w_ptrs, const void* const* s_ptrs,
                         const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                         float* y, cudaStream_t s) {
  if (swiglu) {
    LaunchMma<true, false, true>(xq, x_scales, m, k, w_ptrs, s_ptrs, offsets, num_local, n_out, y,
                                 nullptr, s);
  } else {
    LaunchMma<false, false, true>(xq, x_scales, m, k, w_ptrs, s_ptrs, offsets, num_local, n_out, y,
                                  nullptr, s);
  }
}

}  // namespace afd::kernels::cuda

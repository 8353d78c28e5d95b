// MoE on the GPU: permute (device-side expert counts and offsets, tokens ascending within an
// expert), grouped expert GEMMs reading the per-expert row ranges on the device (no host loop
// over experts, no host sync), weighted combine in slot order.
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
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

// One block, deterministic and graph-safe: counts each local expert's slots, a prefix sum over
// experts, then places the slots in slot order, so tokens stay ascending within an expert. Up
// to kFastPermuteExperts local experts, slots are placed in parallel (see below); above, thread
// e owns local expert e (and e + blockDim, ...) and scans the ids, staged through shared
// memory in tiles.
constexpr int kPermuteThreads = 1024, kPermuteTile = 4096, kMaxLocalExperts = 4096;
constexpr int kFastPermuteExperts = 128;  // per-warp counts in shared memory: 16 KB
// From this many tiles of kPermuteThreads slots on (over 7168 slots: prefill; decode stays at
// one block and one launch), blocks of one tile each (PermuteCount + PermutePlace below).
constexpr int64_t kPermuteMultiMinChunks = 8;

__global__ void Permute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t local,
                        int32_t* offsets, int32_t* src_row, int32_t* row_of_slot) {
  PdlStart();
  __shared__ int32_t tile[kPermuteTile];
  __shared__ int32_t count[kMaxLocalExperts];
  const int64_t slots = n * k;
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) count[e] = 0;
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    src_row[s] = 0;
    const int64_t e = ids[s] - begin;
    row_of_slot[s] = -1;
    if (e >= 0 && e < local) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t total = 0;
    for (int64_t e = 0; e < local; ++e) {
      offsets[e] = total;
      const int32_t c = count[e];
      count[e] = total;  // becomes the expert's cursor
      total += c;
    }
    offsets[local] = total;
  }
  __syncthreads();
  if (local <= kFastPermuteExperts) {
    // Slots in tiles of one per thread: a slot's place is its expert's cursor + the same-expert
    // slots of earlier warps in the tile (a prefix over per-warp counts) + those of lower lanes
    // in its warp (__match_any_sync), so slot order is kept without a serial scan.
    __shared__ int32_t warp_count[kPermuteThreads / 32][kFastPermuteExperts];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t e = threadIdx.x; e < (kPermuteThreads / 32) * local; e += blockDim.x) {
      warp_count[e / local][e % local] = 0;
    }
    for (int64_t t0 = 0; t0 < slots; t0 += kPermuteThreads) {
      const int64_t s = t0 + threadIdx.x;
      const int64_t e = s < slots ? ids[s] - begin : -1;
      const bool mine = e >= 0 && e < local;
      const int key = mine ? static_cast<int>(e) : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, key);
      const int below = __popc(peers & ((1u << lane) - 1));
      __syncthreads();
      if (mine && below == 0) warp_count[warp][e] = __popc(peers);
      __syncthreads();
      for (int64_t x = threadIdx.x; x < local; x += blockDim.x) {
        int32_t running = count[x];
        for (int w = 0; w < kPermuteThreads / 32; ++w) {
          const int32_t c = warp_count[w][x];
          warp_count[w][x] = running;
          running += c;
        }
        count[x] = running;
      }
      __syncthreads();
      if (mine) {
        const int32_t pos = warp_count[warp][e] + below;
        src_row[pos] = static_cast<int32_t>(s / k);
        row_of_slot[s] = pos;
      }
      __syncthreads();
      for (int64_t x = threadIdx.x; x < (kPermuteThreads / 32) * local; x += blockDim.x) {
        warp_count[x / local][x % local] = 0;
      }
    }
    return;
  }
  for (int64_t t0 = 0; t0 < slots; t0 += kPermuteTile) {
    const int64_t len = min(static_cast<int64_t>(kPermuteTile), slots - t0);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) tile[i] = ids[t0 + i];
    __syncthreads();
    for (int64_t e = threadIdx.x; e < local; e += blockDim.x) {
      const int32_t id = static_cast<int32_t>(begin + e);
      int32_t cursor = count[e];
      for (int64_t i = 0; i < len; ++i) {
        if (tile[i] != id) continue;
        const int64_t s = t0 + i;
        src_row[cursor] = static_cast<int32_t>(s / k);
        row_of_slot[s] = cursor++;
      }
      count[e] = cursor;
    }
    __syncthreads();
  }
}

// Many slots (prefill): the same grouping over blocks of kPermuteThreads slots each, in two
// launches. PermuteCount: each block's per-expert counts of its slots (chunk_count [blocks,
// local]). PermutePlace: each block sums the counts of the blocks before it and of all blocks
// (its experts' bases and the offsets; block 0 writes those), then places its slots as the fast
// path above does one tile (warp prefix + __match_any_sync): chunks in order, warps and lanes in
// order within one, so the output is the one-block kernel's exactly. local <= kFastPermuteExperts.
__global__ void PermuteCount(const int32_t* ids, int64_t slots, int64_t begin, int64_t local,
                             int32_t* chunk_count) {
  PdlStart();
  __shared__ int32_t count[kFastPermuteExperts];
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const int64_t s = int64_t(blockIdx.x) * kPermuteThreads + threadIdx.x;
  if (s < slots) {
    const int64_t e = ids[s] - begin;
    if (e >= 0 && e < local) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) {
    chunk_count[blockIdx.x * local + e] = count[e];
  }
}

__global__ void PermutePlace(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t local,
                             const int32_t* chunk_count, int32_t* offsets, int32_t* src_row,
                             int32_t* row_of_slot) {
  PdlStart();
  __shared__ int32_t base[kFastPermuteExperts], start[kFastPermuteExperts + 1];
  __shared__ int32_t warp_count[kPermuteThreads / 32][kFastPermuteExperts];
  const int64_t slots = n * k, b = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) {
    int32_t before = 0, total = 0;
    for (int64_t c = 0; c < gridDim.x; ++c) {
      const int32_t v = chunk_count[c * local + e];
      before += c < b ? v : 0;
      total += v;
    }
    base[e] = before;
    start[e] = total;
  }
  for (int64_t x = threadIdx.x; x < (kPermuteThreads / 32) * local; x += blockDim.x) {
    warp_count[x / local][x % local] = 0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // experts' first rows: an exclusive sum of their totals
    int32_t run = 0;
    for (int64_t e = 0; e < local; ++e) {
      const int32_t t = start[e];
      start[e] = run;
      run += t;
    }
    start[local] = run;
  }
  __syncthreads();
  if (b == 0) {
    for (int64_t e = threadIdx.x; e <= local; e += blockDim.x) offsets[e] = start[e];
  }
  const int64_t s = b * kPermuteThreads + threadIdx.x;
  const int64_t e = s < slots ? ids[s] - begin : -1;
  const bool mine = e >= 0 && e < local;
  const int key = mine ? static_cast<int>(e) : -1;
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const int below = __popc(peers & ((1u << lane) - 1));
  if (mine && below == 0) warp_count[warp][e] = __popc(peers);
  __syncthreads();
  for (int64_t x = threadIdx.x; x < local; x += blockDim.x) {
    int32_t running = start[x] + base[x];
    for (int w = 0; w < kPermuteThreads / 32; ++w) {
      const int32_t c = warp_count[w][x];
      warp_count[w][x] = running;
      running += c;
    }
  }
  __syncthreads();
  if (s < slots) {
    // Rows past the last expert's are 0 (as the one-block kernel leaves them); placed rows are
    // below start[local], so the two writes never meet.
    if (s >= start[local]) src_row[s] = 0;
    if (mine) {
      const int32_t pos = warp_count[warp][e] + below;
      src_row[pos] = static_cast<int32_t>(s / k);
      row_of_slot[s] = pos;
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

__global__ void RowsToBf16(const float* x, int64_t n, __nv_bfloat16* out) {
  PdlStart();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

// Block r: out[r] = x[index[r]] rounded to bf16 (4 values per thread step; h % 4 == 0, x
// 16-byte aligned, out 8-byte aligned).
__global__ void GatherRowsToBf16(const float* x, const int32_t* index, int64_t h,
                                 __nv_bfloat16* out) {
  PdlStart();
  const float4* src = reinterpret_cast<const float4*>(x + int64_t(index[blockIdx.x]) * h);
  auto* dst = reinterpret_cast<uint2*>(out + int64_t(blockIdx.x) * h);
  for (int64_t i = threadIdx.x; i < h / 4; i += blockDim.x) {
    const float4 v = src[i];
    uint2 packed;
    *reinterpret_cast<__nv_bfloat162*>(&packed.x) = __floats2bfloat162_rn(v.x, v.y);
    *reinterpret_cast<__nv_bfloat162*>(&packed.y) = __floats2bfloat162_rn(v.z, v.w);
    dst[i] = packed;
  }
}

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
constexpr int64_t kMmaMaxAvgRows = 256;  // above: the WMMA path (see LaunchGroupedLinear)

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

// The weight fragments of kMmaUnroll chunks from chunk c (kGuard: the last, possibly partial
// group; chunks past the end are zeros).
template <bool kGuard>
__device__ __forceinline__ void MmaLoadW(const __nv_bfloat16* wa, const __nv_bfloat16* wb, int c,
                                         int chunks, uint4 (&w)[kMmaUnroll][2]) {
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

// Per chunk and m tile: the x fragments from shared memory (xr: this lane's rows gid, gid + 8 of
// each tile, null past the pass) and the 4 mmas.
template <bool kGuard, int kTiles>
__device__ __forceinline__ void MmaCompute(const uint4 (&w)[kMmaUnroll][2],
                                           const __nv_bfloat16* const (&xr)[kTiles][2], int c,
                                           int chunks, int tiles, float (&acc)[kTiles][2][4]) {
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) {
    if (kGuard && c + u >= chunks) break;
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (i >= tiles) break;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const int off = (c + u) * 32;
      const uint4 lo = xr[i][0] ? *reinterpret_cast<const uint4*>(xr[i][0] + off) : zero;
      const uint4 hi = xr[i][1] ? *reinterpret_cast<const uint4*>(xr[i][1] + off) : zero;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        MmaBf16(acc[i][j], lo.x, hi.x, lo.y, hi.y, w[u][j].x, w[u][j].y);
        MmaBf16(acc[i][j], lo.z, hi.z, lo.w, hi.w, w[u][j].z, w[u][j].w);
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
template <bool kSwiglu, bool kBf16Out, int kTiles, int kHalves = 1,
          int kWarps = 4 * kTiles* kHalves>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)  // 128 registers
    GroupedMma(const __nv_bfloat16* x, int64_t k, int piece, const void* const* w_ptrs,
               const int32_t* offsets, int64_t num_local, int64_t n_out, float* y,
               __nv_bfloat16* yb) {
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
  const auto* w = static_cast<const __nv_bfloat16*>(w_ptrs[e]);
  const __nv_bfloat16* wa = w + (n0 + gid) * k + t * 8;
  const __nv_bfloat16* wb = w + ((kSwiglu ? n_out + n0 : (second ? n0 + 8 : n0)) + gid) * k + t * 8;
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
      uint4 wv[kMmaUnroll][2];
      if (active && chunks > 0) {
        if (chunks >= kMmaUnroll) {
          MmaLoadW<false>(wa + kb, wb + kb, 0, chunks, wv);
        } else {
          MmaLoadW<true>(wa + kb, wb + kb, 0, chunks, wv);
        }
      }
      CopyAsyncWaitAll();
      __syncthreads();
      if (!active) continue;
      for (int c = 0; c < chunks; c += kMmaUnroll) {
        if (c > 0) {
          if (c + kMmaUnroll <= chunks) {
            MmaLoadW<false>(wa + kb, wb + kb, c, chunks, wv);
          } else {
            MmaLoadW<true>(wa + kb, wb + kb, c, chunks, wv);
          }
        }
        if (c + kMmaUnroll <= chunks) {
          MmaCompute<false>(wv, xr, c, chunks, tiles, acc);
        } else {
          MmaCompute<true>(wv, xr, c, chunks, tiles, acc);
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

// out[t] (+)= sum_j y[row_of_slot[t, j]] * w[t, j], j in order, then + addend[t] when given (the
// shared experts' output: the same bits as a separate Add after). Block (token, column slice),
// one thread per kVec columns: the k row loads of a thread are independent, so they are in
// flight together (one thread walking the k slots of 8 columns in series took 22 us per layer
// at batch 1, the latency of ~50 dependent loads).
template <int kVec>
__global__ void Combine(const float* y, int64_t h, const int32_t* ros, const float* w, int64_t k,
                        bool accumulate, const float* addend, float* out) {
  PdlStart();
  using V = std::conditional_t<kVec == 4, float4, float>;
  const int64_t t = blockIdx.x;
  const int64_t i = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  if (i >= h) return;
  float o[kVec];
  if (accumulate) {
    const V v = *reinterpret_cast<const V*>(out + t * h + i);
    memcpy(o, &v, sizeof(V));
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[e] = 0.0f;
  }
#pragma unroll 8
  for (int64_t j = 0; j < k; ++j) {
    const int32_t r = ros[t * k + j];
    if (r < 0) continue;
    const float wj = w[t * k + j];
    const V v = *reinterpret_cast<const V*>(y + int64_t(r) * h + i);
    float yv[kVec];
    memcpy(yv, &v, sizeof(V));
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[e] += yv[e] * wj;
  }
  if (addend != nullptr) {
    const V a = *reinterpret_cast<const V*>(addend + t * h + i);
    float av[kVec];
    memcpy(av, &a, sizeof(V));
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[e] += av[e];
  }
  V v;
  memcpy(&v, o, sizeof(V));
  *reinterpret_cast<V*>(out + t * h + i) = v;
}

// The mma.sync path's shapes: K in 32-wide chunks, N in 8-column tiles, at most
// kMmaMaxAvgRows rows per expert on average.
bool MmaFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local) {
  return k % 32 == 0 && n_out % 8 == 0 && m <= kMmaMaxAvgRows * num_local;
}

// The tiled path's (GroupedTiled): more rows per expert on average, 16-byte rows, even N (pairs
// of outputs per store).
bool TiledFits(int64_t m, int64_t k, int64_t n_out, int64_t num_local) {
  return k % 8 == 0 && n_out % 2 == 0 && m > kMmaMaxAvgRows * num_local &&
         (m + kTileM - 1) / kTileM + num_local <= 65535;  // grid.y
}

void LaunchGatherRowsToBf16(const float* x, const int32_t* index, int64_t m, int64_t h,
                            __nv_bfloat16* xb, cudaStream_t s) {
  if (m == 0) return;
  AFD_CHECK(h % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
            "GatherRowsToBf16: hidden size {} must be a multiple of 4, x 16-byte aligned", h);
  LaunchPdl(GatherRowsToBf16, static_cast<unsigned>(m), 256, 0, s, x, index, h, xb);
  CheckLaunch("GatherRowsToBf16");
}

// x [n] rounded to bf16 into xb (the mma path's input).
void LaunchRowsToBf16(const float* x, int64_t n, __nv_bfloat16* xb, cudaStream_t s) {
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  LaunchPdl(RowsToBf16, blocks, 256, 0, s, x, n, xb);
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

// GroupedMma with its plan: y (fp32) or, kBf16Out, yb (bf16).
template <bool kSwiglu, bool kBf16Out>
void LaunchMma(const __nv_bfloat16* x, int64_t m, int64_t k, const void* const* w_ptrs,
               const int32_t* offsets, int64_t num_local, int64_t n_out, float* y,
               __nv_bfloat16* yb, cudaStream_t s) {
  const MmaLaunch p = PlanMma(m, k, n_out, kSwiglu, num_local);
  const auto go = [&](auto tiles, auto halves, auto wide) {
    constexpr int kTiles = decltype(tiles)::value, kHalves = decltype(halves)::value;
    constexpr int kWide = decltype(wide)::value;  // 1 + (16 warps, twice the stage per tile)
    const auto kernel =
        GroupedMma<kSwiglu, kBf16Out, kTiles, kHalves, 4 * kTiles * kHalves * kWide>;
    // The opt-in above 48 KB, once per instance (this lambda is instantiated per plan shape).
    static const bool raised = [&] {
      AFD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          kWide * kHalves * kTiles * kMmaTileStageBytes));
      return true;
    }();
    (void)raised;
    LaunchPdl(kernel, p.grid, p.warps * 32, p.smem, s, x, k, p.piece, w_ptrs, offsets, num_local,
              n_out, y, yb);
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

int64_t MoePermuteScratchInts(int64_t n, int64_t k, int64_t num_local) {
  const int64_t chunks = (n * k + kPermuteThreads - 1) / kPermuteThreads;
  return chunks >= kPermuteMultiMinChunks && num_local <= kFastPermuteExperts ? chunks * num_local
                                                                              : 0;
}

void LaunchMoePermute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t num_local,
                      int32_t* offsets, int32_t* src_row, int32_t* row_of_slot, int32_t* scratch,
                      cudaStream_t s) {
  AFD_CHECK(num_local <= kMaxLocalExperts, "MoePermute on cuda: {} local experts, at most {}",
            num_local, kMaxLocalExperts);
  if (MoePermuteScratchInts(n, k, num_local) > 0) {
    AFD_CHECK(scratch != nullptr, "MoePermute on cuda: {} slots need the counts' scratch", n * k);
    const auto chunks = static_cast<unsigned>((n * k + kPermuteThreads - 1) / kPermuteThreads);
    LaunchPdl(PermuteCount, chunks, kPermuteThreads, 0, s, ids, n * k, begin, num_local, scratch);
    LaunchPdl(PermutePlace, chunks, kPermuteThreads, 0, s, ids, n, k, begin, num_local,
              static_cast<const int32_t*>(scratch), offsets, src_row, row_of_slot);
    CheckLaunch("MoePermute (blocks)");
    return;
  }
  LaunchPdl(Permute, 1, kPermuteThreads, 0, s, ids, n, k, begin, num_local, offsets, src_row,
            row_of_slot);
  CheckLaunch("MoePermute");
}

void LaunchGroupedLinear(const float* x, int64_t m, int64_t k, const void* const* w_ptrs, bool bf16,
                         const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                         float* y, uint16_t* x_bf16, cudaStream_t s) {
  if (m == 0 || num_local == 0) return;
  // bf16 experts up to kMmaMaxAvgRows rows each on average (decode and mid-sized groups):
  // mma.sync straight from global memory, each used expert's weights read from memory once (the
  // passes over more rows run side by side in row slices and share them through L2). x is rounded
  // to bf16 once into the x_bf16 scratch [m, k].
  if (bf16 && x_bf16 != nullptr && MmaFits(m, k, n_out, num_local)) {
    auto* xb = reinterpret_cast<__nv_bfloat16*>(x_bf16);
    LaunchRowsToBf16(x, m * k, xb, s);
    if (swiglu) {
      LaunchMma<true, false>(xb, m, k, w_ptrs, offsets, num_local, n_out, y, nullptr, s);
    } else {
      LaunchMma<false, false>(xb, m, k, w_ptrs, offsets, num_local, n_out, y, nullptr, s);
    }
    CheckLaunch("GroupedExpertMlp (mma)");
    return;
  }
  // Other bf16 experts with 16+ rows each on average (over kMmaMaxAvgRows, or K not a multiple
  // of 32): WMMA tensor cores (needs K and N multiples of 16).
  if (bf16 && m >= 16 * num_local && k % 16 == 0 && n_out % 16 == 0) {
    const dim3 g(static_cast<unsigned>((n_out + kWmTn - 1) / kWmTn),
                 static_cast<unsigned>((m + kWmTm - 1) / kWmTm), static_cast<unsigned>(num_local));
    if (swiglu) {
      LaunchPdl(GroupedWmma<true>, g, 256, 0, s, x, k, w_ptrs, offsets, n_out, y);
    } else {
      LaunchPdl(GroupedWmma<false>, g, 256, 0, s, x, k, w_ptrs, offsets, n_out, y);
    }
    CheckLaunch("GroupedExpertMlp (wmma)");
    return;
  }
  // Other bf16 decode sizes: x rounded to bf16 once (x_bf16 scratch [m, k]), 4 weight rows per
  // warp.
  if (bf16 && x_bf16 != nullptr && m <= 32 * num_local && k % 8 == 0) {
    auto* xb = reinterpret_cast<__nv_bfloat16*>(x_bf16);
    LaunchRowsToBf16(x, m * k, xb, s);
    const int64_t cols = swiglu ? kWRows / 2 : kWRows;
    const dim3 g(static_cast<unsigned>((n_out + kGemvWarps * cols - 1) / (kGemvWarps * cols)), 1,
                 static_cast<unsigned>(num_local));
    if (swiglu) {
      LaunchPdl(GroupedGemvBf16<true>, g, kGemvWarps * 32, 0, s, xb, k, w_ptrs, offsets, n_out, y);
    } else {
      LaunchPdl(GroupedGemvBf16<false>, g, kGemvWarps * 32, 0, s, xb, k, w_ptrs, offsets, n_out, y);
    }
    CheckLaunch("GroupedExpertMlp (bf16 gemv)");
    return;
  }
  // Decode sizes (up to ~32 rows per expert on average): the per-column path reads each used
  // expert's weights once (row chunks re-read them from L1/L2). Needs K a multiple of 8
  // (16-byte loads). Prefill-sized fp32 groups take the tiled path.
  if (m <= 32 * num_local && k % 8 == 0) {
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
    CheckLaunch("GroupedExpertMlp (gemv)");
    return;
  }
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
  CheckLaunch("GroupedExpertMlp");
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

bool LaunchGroupedMlpMma(const float* x, const int32_t* src_row, int64_t m, int64_t h,
                         int64_t inter, const void* const* gate_up, const void* const* down,
                         const int32_t* offsets, int64_t num_local, uint16_t* x_bf16,
                         uint16_t* act_bf16, float* out, cudaStream_t s) {
  const bool tiled = TiledFits(m, h, inter, num_local) && TiledFits(m, inter, h, num_local);
  if (m == 0 || num_local == 0 ||
      (!tiled && (!MmaFits(m, h, inter, num_local) || !MmaFits(m, inter, h, num_local)))) {
    return false;
  }
  auto* xb = reinterpret_cast<__nv_bfloat16*>(x_bf16);
  auto* ab = reinterpret_cast<__nv_bfloat16*>(act_bf16);
  if (src_row != nullptr) {
    LaunchGatherRowsToBf16(x, src_row, m, h, xb, s);
  } else {
    LaunchRowsToBf16(x, m * h, xb, s);
  }
  if (tiled) {
    LaunchTiled<true, true>(xb, m, h, gate_up, offsets, num_local, inter, nullptr, ab, s);
    LaunchTiled<false, false>(ab, m, inter, down, offsets, num_local, h, out, nullptr, s);
    CheckLaunch("GroupedExpertMlp (tiled, bf16 intermediate)");
    return true;
  }
  LaunchMma<true, true>(xb, m, h, gate_up, offsets, num_local, inter, nullptr, ab, s);
  LaunchMma<false, false>(ab, m, inter, down, offsets, num_local, h, out, nullptr, s);
  CheckLaunch("GroupedExpertMlp (mma, bf16 intermediate)");
  return true;
}

void LaunchMoeCombine(const float* y, int64_t h, const int32_t* row_of_slot, const float* weights,
                      int64_t n, int64_t k, bool accumulate, const float* addend, float* out,
                      cudaStream_t s) {
  if (n == 0 || h == 0) return;
  constexpr int kThreadsPerBlock = 128;
  const auto launch = [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    const int64_t per_block = int64_t{kThreadsPerBlock} * kVec;
    const dim3 grid(static_cast<unsigned>(n),
                    static_cast<unsigned>((h + per_block - 1) / per_block));
    LaunchPdl(Combine<kVec>, grid, kThreadsPerBlock, 0, s, y, h, row_of_slot, weights, k,
              accumulate, addend, out);
  };
  const bool vec4 = h % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(addend) % 16 == 0;
  if (vec4) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  CheckLaunch("MoeCombine");
}

}  // namespace afd::kernels::cuda

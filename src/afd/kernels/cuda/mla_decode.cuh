// What the absorbed MLA decode kernels share (mla_decode_chunks.cu, mla_decode_tiles.cu,
// mla_decode_wgmma.cu; the policy that picks one is LaunchMlaAttention in mla.cu): the block
// shapes, the partial layout and the split merge. Included by those files and mla.cu alone; the
// constants and device functions keep internal linkage, as when the kernels were one file.
// Partials: partial[((t·nh + h)·splits + split)] = [m (natural log) | l | o_lat[kvr]].
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "afd/kernels/cuda/attention_args.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kAttnThreads = 256;
constexpr int kGroup = 16;  // heads per block
constexpr int kRows = 16;   // positions per chunk (kGroup · kRows == kAttnThreads)
constexpr int kMaxLatent = 2 * kAttnThreads;
constexpr int kMaxWidth = 640;  // latent + rope dims (DeepSeek: 512 + 64)

// Shared memory rows are kTileStride bf16 (1168 bytes: rows 16 bytes apart in the banks, so the
// 8 row addresses of an ldmatrix hit distinct banks).
constexpr int kTileRows = 64;
constexpr int kTileLatent = 512, kTileRope = 64, kTileWidth = kTileLatent + kTileRope;
constexpr int kTileStride = kTileWidth + 8;
constexpr int kTilePStride = kTileRows + 8;
constexpr int kTileWarps = 8;
constexpr int kTileChunks = kTileWidth / 8;  // 16-byte pieces of a row
// A row's pieces are copied by 4 threads: thread tid copies row tid / 4, pieces tid % 4 + 4i.
static_assert(kTileWarps * 32 == 4 * kTileRows && kTileChunks % 4 == 0);
// Shared memory of AttentionTiles<kTok, kBufs> (kTok query tokens per block, kBufs tile buffers).
constexpr size_t TileSmemBytes(int tokens, int bufs) {
  return (size_t(tokens * kGroup + bufs * kTileRows) * kTileStride +
          tokens * kGroup * kTilePStride) *
             2 +
         2 * kTileWarps * tokens * kGroup * sizeof(float);
}
// Two query tokens per block from this many tokens on (prefill; one split): each tile read
// from L2 serves both tokens' 32 rows.
constexpr int64_t kTilePairMinTokens = 1024;

// The end of a split of AttentionTiles when there are several: its partial is written; the
// last block of the (token, head group) to arrive (a counter per pair, zero between launches:
// that block re-arms it) merges every split's partial into o_lat in split order, with
// AttentionCombine's arithmetic (the same bits), so the result does not depend on which block
// came last. The merge reads the partials from L2 in batches of kMergeBatch loads per
// thread per split (a load at a time would be one L2 round trip per output: ~16 us a block);
// 8-byte loads, as the partial rows are 8-byte aligned (kvr + 2 floats each).
// scratch: kMaxMlaSplits x kGroup floats of shared memory (the factors e^{m_s - M}), then the
// kGroup totals.
constexpr int kMaxMlaSplits = 64;
constexpr int kMergeBatch = 8;
__device__ void MergeIfLast(const float* partial, int64_t tok, int64_t nh, int64_t g0, int g_count,
                            int splits, int* counter, float* o_lat, float* scratch) {
  constexpr int64_t kvr = kTileLatent;
  __shared__ int last;
  __threadfence();  // this thread's partial is visible device-wide before the arrival
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const auto part = [&](int h, int s) {
    return partial + ((tok * nh + g0 + h) * splits + s) * (kvr + 2);
  };
  float* factor = scratch;                          // [splits][kGroup]
  float* total = scratch + kMaxMlaSplits * kGroup;  // [kGroup]
  if (threadIdx.x < g_count) {
    const int h = threadIdx.x;
    float mx = -FLT_MAX;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(part(h, s)));
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float f = expf(__ldcg(part(h, s)) - mx);
      factor[s * kGroup + h] = f;
      sum += __ldcg(part(h, s) + 1) * f;
    }
    total[h] = sum;
  }
  if (threadIdx.x == 0) *counter = 0;
  __syncthreads();
  // float2 columns of a head: a partial's o_lat starts 2 floats past [m | l], 8-byte aligned only.
  constexpr int kVecs = kvr / 2;
  const int vecs = g_count * kVecs;
  for (int base = threadIdx.x; base < vecs; base += kMergeBatch * blockDim.x) {
    float2 acc[kMergeBatch];
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b) acc[b] = make_float2(0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      float2 v[kMergeBatch];
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b) {
        const int e = base + b * blockDim.x;
        if (e < vecs) {
          v[b] = __ldcg(reinterpret_cast<const float2*>(part(e / kVecs, s) + 2) + e % kVecs);
        }
      }
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b) {
        const int e = base + b * blockDim.x;
        if (e >= vecs) break;
        const float f = factor[s * kGroup + e / kVecs];
        acc[b].x += v[b].x * f;
        acc[b].y += v[b].y * f;
      }
    }
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b) {
      const int e = base + b * blockDim.x;
      if (e >= vecs) break;
      const int h = e / kVecs;
      const float t = total[h];
      reinterpret_cast<float2*>(o_lat + (tok * nh + g0 + h) * kvr)[e % kVecs] =
          make_float2(acc[b].x / t, acc[b].y / t);
    }
  }
}

// The partial of an empty split (splits > 1: m = -FLT_MAX, l = 0, o = 0), then the merge if this
// block is the last of its (token, head group).
__device__ void EmptySplitOutput(int64_t tok, int64_t nh, int64_t g0, int g_count, int64_t splits,
                                 int64_t split, float* partial, int* counter, float* o_lat,
                                 float* scratch) {
  constexpr int64_t kvr = kTileLatent;
  for (int h = 0; h < g_count; ++h) {
    float* part = partial + ((tok * nh + g0 + h) * splits + split) * (kvr + 2);
    if (threadIdx.x == 0) {
      part[0] = -FLT_MAX;
      part[1] = 0.0f;
    }
    for (int64_t l = threadIdx.x; l < kvr; l += blockDim.x) part[2 + l] = 0.0f;
  }
  MergeIfLast(partial, tok, nh, g0, g_count, static_cast<int>(splits), counter, o_lat, scratch);
}

// A token's result after its tiles, warp w holding o_lat columns 64 w .. 64 w + 63 of heads gid
// (o[c][0..1]) and gid + 8 (o[c][2..3]); m: the running maxima (log2 units), total: the sums
// over the block. One split: o / total into o_lat. Several: the split's partial (m in
// natural-log units, l, o) and the merge if this block is the last (every thread calls it then;
// kSplits false: one split always, the merge not compiled in).
template <bool kSplits>
__device__ __forceinline__ void TileOutput(const float (&o)[8][4], float m_lo, float m_hi,
                                           float total_lo, float total_hi, int64_t tok, int64_t nh,
                                           int64_t g0, int g_count, int64_t splits, int64_t split,
                                           float* partial, int* counter, float* o_lat,
                                           float* scratch) {
  constexpr int64_t kvr = kTileLatent;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
  if (!kSplits || splits == 1) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int col = 64 * warp + 8 * c + 2 * tq;
      if (gid < g_count) {
        *reinterpret_cast<float2*>(o_lat + (tok * nh + g0 + gid) * kvr + col) =
            make_float2(o[c][0] / total_lo, o[c][1] / total_lo);
      }
      if (gid + 8 < g_count) {
        *reinterpret_cast<float2*>(o_lat + (tok * nh + g0 + gid + 8) * kvr + col) =
            make_float2(o[c][2] / total_hi, o[c][3] / total_hi);
      }
    }
    return;
  }
  if constexpr (!kSplits) return;
  constexpr float kLn2 = 0.693147180559945309f;
  const auto part = [&](int h) {
    return partial + ((tok * nh + g0 + h) * splits + split) * (kvr + 2);
  };
  if (tq == 0 && warp == 0) {
    if (gid < g_count) {
      part(gid)[0] = m_lo * kLn2;
      part(gid)[1] = total_lo;
    }
    if (gid + 8 < g_count) {
      part(gid + 8)[0] = m_hi * kLn2;
      part(gid + 8)[1] = total_hi;
    }
  }
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int col = 64 * warp + 8 * c + 2 * tq;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int hh = gid + 8 * half;
      if (hh >= g_count) continue;
      *reinterpret_cast<float2*>(part(hh) + 2 + col) =
          make_float2(o[c][2 * half], o[c][2 * half + 1]);
    }
  }
  MergeIfLast(partial, tok, nh, g0, g_count, static_cast<int>(splits), counter, o_lat, scratch);
}

}  // namespace

// The kernels' arguments past the grid (the tiles and wgmma forms).
struct MlaTileArgs {
  const float* q;
  int64_t n, heads;
  const float* q_lat;
  int64_t dn;
  PagedArgs t;
  const __nv_bfloat16* cache;
  int64_t h0, nh;
  float scale_log2;  // the softmax scale times log2(e)
  int64_t span;      // positions per split, a multiple of kTileRows
  float* partial;
  int* counters;
  float* o_lat;
};

// mla_decode_chunks.cu -- AttentionPartial over chunks of kRows positions (any width up to
// kMaxWidth, f32 or bf16 cache, TF32 tensor cores where tf32 and the shapes allow), then
// AttentionCombine merges the splits into o_lat.
void LaunchMlaChunks(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t kvr,
                     int64_t dn, int64_t dr, const PagedArgs& t, const void* cache, bool bf16_cache,
                     int64_t h0, int64_t h1, float scale, int64_t max_context, int64_t splits,
                     bool tf32, float* partial, float* o_lat, cudaStream_t s);
// mla_decode_tiles.cu -- AttentionTiles (DeepSeek's 512 + 64, bf16 cache): `tokens` (1 or 2)
// query tokens a block, `bufs` (1 or 2; 2 with two tokens) tile buffers, bulk (TMA) row copies
// where `bulk` (sm_90+), else cp.async; grid (tokens, head groups, splits).
void LaunchMlaTiles(int tokens, int bufs, bool bulk, int64_t splits, const MlaTileArgs& a,
                    cudaStream_t s);
// mla_decode_wgmma.cu -- AttentionWg (sm_90a; block size a multiple of kTileRows): the scores
// on wgmma from TMA boxes of the layer's cache (cache_rows rows), `bufs` tile buffers.
void LaunchMlaWg(int bufs, const void* cache, int64_t cache_rows, int64_t splits,
                 const MlaTileArgs& a, cudaStream_t s);

}  // namespace afd::kernels::cuda

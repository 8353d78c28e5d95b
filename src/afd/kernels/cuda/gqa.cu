// Grouped-query attention over the paged key/value cache (Qwen3): the fused q/k norm + rope +
// cache write, and flash-decoding attention -- a block per (token, group of q heads of one KV
// head, context split), its warps taking chunks of the split's positions with an online softmax
// (GqaAttendChunks for head dims 32 / 64 / 128 / 256; GqaAttend, a position per warp step, for
// other sizes), one merge kernel when the context is split. The q heads of a KV head share
// every k and v row a block reads. Prefill runs the same kernels (each token over its causal
// context).
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "afd/common/error.h"
#include "afd/kernels/cuda/gqa.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/pdl.cuh"
#include "afd/kernels/cuda/rope.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kWriteThreads = 64;
constexpr int kAttendWarps = 4;
constexpr int kHeadsPerBlock = 8;  // q heads of one KV head per attention block

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// Block (token, head of heads + kvh): q head hh (hh < heads) or k head hh - heads, normed over
// d in fp32 then roped in shared memory; q to q, k (and the KV head's v, copied) to the token's
// cache row.
template <typename T>
__global__ void __launch_bounds__(kWriteThreads)
    GqaWrite(const float* qkv, int64_t heads, int64_t kvh, int64_t d, const float* q_norm,
             const float* k_norm, float eps, PagedArgs t, RopeArgs r, float* q, T* cache) {
  PdlStart();
  __shared__ float v[kGqaMaxHeadDim];
  __shared__ float partial[kWriteThreads / 32];
  const int64_t i = blockIdx.x, hh = blockIdx.y;
  const bool is_q = hh < heads;
  const int64_t slot = t.slot_mapping[i];
  if (!is_q && slot < 0) return;  // a padding row of a captured graph: no cache row
  const float* src = qkv + i * (heads + 2 * kvh) * d + hh * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float x = src[j];
    v[j] = x;
    ss += x * x;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWriteThreads / 32; ++w) total += partial[w];
  const float inv = rsqrtf(total / static_cast<float>(d) + eps);
  const float* w = is_q ? q_norm : k_norm;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) v[j] = w[j] * (v[j] * inv);
  __syncthreads();
  const int64_t pos = t.positions[i];
  for (int64_t p = threadIdx.x; p < d / 2; p += blockDim.x) RotatePair(v, r, pos, p);
  __syncthreads();
  if (is_q) {
    float* out = q + (i * heads + hh) * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[j] = v[j];
    return;
  }
  const int64_t g = hh - heads;
  T* row = cache + slot * 2 * kvh * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    Store(row + g * d + j, v[j]);
    Store(row + (kvh + g) * d + j, src[kvh * d + j]);  // v of KV head g
  }
}

// The heads of attention block `b` (of the blocks over heads [h0, h1)): [*hs, *he), all of one
// KV head *g. Blocks cover the KV groups in chunks of up to kHeadsPerBlock heads.
template <int kMaxHeads = kHeadsPerBlock>
__device__ __forceinline__ void BlockHeads(int64_t b, int64_t group, int64_t h0, int64_t h1,
                                           int64_t* g, int64_t* hs, int64_t* he) {
  const int64_t chunk = group < kMaxHeads ? group : kMaxHeads;
  const int64_t per_group = (group + chunk - 1) / chunk;
  const int64_t first = (h0 / group) * per_group + (h0 % group) / chunk;
  const int64_t id = first + b;
  *g = id / per_group;
  const int64_t start = *g * group + (id % per_group) * chunk;
  *hs = start > h0 ? start : h0;
  const int64_t end = min(start + chunk, (*g + 1) * group);
  *he = end < h1 ? end : h1;
}

// Block (token, head block, split): positions [split·span, min((split + 1)·span, len)) of the
// token's context, warp w taking positions ≡ w (mod kAttendWarps); lane l holds head dims
// l + 32u (u < PER) of q, of each row and of the output. Then the warps merge in shared memory;
// one split writes out, several write partial[(t·nh + h - h0)·splits + split] = [m | l | o[d]].
template <int PER, typename T>
__global__ void __launch_bounds__(kAttendWarps * 32)
    GqaAttend(const float* q, int64_t heads, int64_t kvh, int64_t d, PagedArgs t, const T* cache,
              int64_t h0, int64_t h1, float scale, int64_t splits, float* partial, float* out) {
  PdlStart();
  __shared__ float merge_m[kAttendWarps][kHeadsPerBlock], merge_l[kAttendWarps][kHeadsPerBlock];
  __shared__ float merge_o[kAttendWarps][kHeadsPerBlock][PER * 32];
  const int64_t tok = blockIdx.x, split = blockIdx.z, group = heads / kvh, nh = h1 - h0;
  int64_t g, hs, he;
  BlockHeads(blockIdx.y, group, h0, h1, &g, &hs, &he);
  const int count = static_cast<int>(he - hs);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t len = t.positions[tok] + 1;
  const int64_t span = (len + splits - 1) / splits;
  const int64_t lo = split * span, hi = min(len, lo + span);
  const int32_t* table = t.block_tables + t.seq_index[tok] * t.max_blocks;
  const int64_t width = 2 * kvh * d;
  float qr[kHeadsPerBlock][PER], acc[kHeadsPerBlock][PER], m[kHeadsPerBlock], l[kHeadsPerBlock];
#pragma unroll
  for (int c = 0; c < kHeadsPerBlock; ++c) {
    m[c] = -INFINITY;
    l[c] = 0.0f;
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int64_t e = lane + 32 * u;
      qr[c][u] = c < count && e < d ? q[(tok * heads + hs + c) * d + e] : 0.0f;
      acc[c][u] = 0.0f;
    }
  }
  for (int64_t j = lo + warp; j < hi; j += kAttendWarps) {
    const int64_t slot =
        static_cast<int64_t>(table[j / t.block_size]) * t.block_size + j % t.block_size;
    const T* row = cache + slot * width;
    float kv[PER], vv[PER];
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int64_t e = lane + 32 * u;
      kv[u] = e < d ? Load(row + g * d + e) : 0.0f;
      vv[u] = e < d ? Load(row + (kvh + g) * d + e) : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < kHeadsPerBlock; ++c) {
      if (c >= count) break;
      float s = 0.0f;
#pragma unroll
      for (int u = 0; u < PER; ++u) s += qr[c][u] * kv[u];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      s *= scale;
      const float m_new = fmaxf(m[c], s);
      const float corr = expf(m[c] - m_new), p = expf(s - m_new);
      l[c] = l[c] * corr + p;
#pragma unroll
      for (int u = 0; u < PER; ++u) acc[c][u] = acc[c][u] * corr + p * vv[u];
      m[c] = m_new;
    }
  }
#pragma unroll
  for (int c = 0; c < kHeadsPerBlock; ++c) {
    if (lane == 0) {
      merge_m[warp][c] = m[c];
      merge_l[warp][c] = l[c];
    }
#pragma unroll
    for (int u = 0; u < PER; ++u) merge_o[warp][c][lane + 32 * u] = acc[c][u];
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < count * d; idx += blockDim.x) {
    const int c = static_cast<int>(idx / d);
    const int64_t e = idx % d;
    float mx = -INFINITY;
    for (int w = 0; w < kAttendWarps; ++w) mx = fmaxf(mx, merge_m[w][c]);
    float total = 0.0f, o = 0.0f;
    for (int w = 0; w < kAttendWarps; ++w) {
      const float f = merge_m[w][c] == -INFINITY ? 0.0f : expf(merge_m[w][c] - mx);
      total += merge_l[w][c] * f;
      o += merge_o[w][c][e] * f;
    }
    const int64_t h = hs + c - h0;
    if (splits == 1) {
      out[(tok * nh + h) * d + e] = o / total;
    } else {
      float* part = partial + ((tok * nh + h) * splits + split) * (d + 2);
      if (e == 0) {
        part[0] = mx;
        part[1] = total;
      }
      part[2 + e] = o;
    }
  }
}

// Loads of n consecutive cache values (16-byte aligned for the vector forms) as floats.
template <int N>
__device__ __forceinline__ void LoadRow(const float* p, float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 x = *reinterpret_cast<const float4*>(p + i);
      v[i] = x.x, v[i + 1] = x.y, v[i + 2] = x.z, v[i + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = p[i];
  }
}
template <int N>
__device__ __forceinline__ void LoadRow(const __nv_bfloat16* p, float (&v)[N]) {
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 8) {
      const uint4 x = *reinterpret_cast<const uint4*>(p + i);
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[i + 2 * j] = __uint_as_float(w[j] << 16);
        v[i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      }
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p + i);
      v[i] = __uint_as_float(w << 16);
      v[i + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __bfloat162float(p[i]);
  }
}

// GqaAttend for head dims D in {32, 64, 128, 256}: the same blocks and outputs, each warp taking
// chunks of 32 positions at a time. Scores: lane j scores position j of the chunk against every
// head of the block (its k row read with 16-byte loads; q from shared memory, a broadcast), so
// only each head's chunk maximum needs shuffles. P·V: lane l owns output dims [l·D/32,
// (l+1)·D/32) and walks the chunk's rows (their slots shuffled from the lanes that found them),
// p from shared memory. Per lane, the running sums of p stay unreduced until the end.
constexpr int kChunk = 32;

template <int D, typename T>
__global__ void __launch_bounds__(kAttendWarps * 32)
    GqaAttendChunks(const float* q, int64_t heads, int64_t kvh, PagedArgs t, const T* cache,
                    int64_t h0, int64_t h1, float scale, int64_t splits, float* partial,
                    float* out) {
  constexpr int kPer = D / 32;  // output dims per lane
  __shared__ __align__(16) float q_s[kHeadsPerBlock][D];
  __shared__ float p_s[kAttendWarps][kHeadsPerBlock][kChunk];
  __shared__ float merge_m[kAttendWarps][kHeadsPerBlock], merge_l[kAttendWarps][kHeadsPerBlock];
  __shared__ float merge_o[kAttendWarps][kHeadsPerBlock][D];
  PdlStart();
  const int64_t tok = blockIdx.x, split = blockIdx.z, group = heads / kvh, nh = h1 - h0;
  int64_t g, hs, he;
  BlockHeads(blockIdx.y, group, h0, h1, &g, &hs, &he);
  const int count = static_cast<int>(he - hs);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kHeadsPerBlock * D; i += blockDim.x) {
    const int c = i / D;
    q_s[c][i % D] = c < count ? q[(tok * heads + hs + c) * D + i % D] * scale : 0.0f;
  }
  __syncthreads();
  const int64_t len = t.positions[tok] + 1;
  const int64_t span = (len + splits - 1) / splits;
  const int64_t lo = split * span, hi = min(len, lo + span);
  const int32_t* table = t.block_tables + t.seq_index[tok] * t.max_blocks;
  const int64_t width = 2 * kvh * D;
  const T* k_base = cache + g * D;
  const T* v_base = cache + (kvh + g) * D + lane * kPer;
  float m[kHeadsPerBlock], l[kHeadsPerBlock], acc[kHeadsPerBlock][kPer];
#pragma unroll
  for (int c = 0; c < kHeadsPerBlock; ++c) {
    m[c] = -INFINITY;
    l[c] = 0.0f;
#pragma unroll
    for (int u = 0; u < kPer; ++u) acc[c][u] = 0.0f;
  }
  for (int64_t base = lo + warp * kChunk; base < hi; base += kAttendWarps * kChunk) {
    const int64_t j = base + lane;
    const bool valid = j < hi;
    int64_t slot = 0;
    float s[kHeadsPerBlock];
#pragma unroll
    for (int c = 0; c < kHeadsPerBlock; ++c) s[c] = 0.0f;
    if (valid) {
      slot = static_cast<int64_t>(table[j / t.block_size]) * t.block_size + j % t.block_size;
      const T* k_row = k_base + slot * width;
#pragma unroll
      for (int e0 = 0; e0 < D; e0 += 8) {
        float kv[8];
        LoadRow<8>(k_row + e0, kv);
#pragma unroll
        for (int c = 0; c < kHeadsPerBlock; ++c) {
          const float4 qa = *reinterpret_cast<const float4*>(&q_s[c][e0]);
          const float4 qb = *reinterpret_cast<const float4*>(&q_s[c][e0 + 4]);
          s[c] += qa.x * kv[0] + qa.y * kv[1] + qa.z * kv[2] + qa.w * kv[3] + qb.x * kv[4] +
                  qb.y * kv[5] + qb.z * kv[6] + qb.w * kv[7];
        }
      }
    }
    float corr[kHeadsPerBlock];
#pragma unroll
    for (int c = 0; c < kHeadsPerBlock; ++c) {
      float mx = valid ? s[c] : -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m[c], mx);
      corr[c] = expf(m[c] - m_new);
      const float p = valid ? expf(s[c] - m_new) : 0.0f;
      l[c] = l[c] * corr[c] + p;
      m[c] = m_new;
      p_s[warp][c][lane] = p;
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kHeadsPerBlock; ++c) {
#pragma unroll
      for (int u = 0; u < kPer; ++u) acc[c][u] *= corr[c];
    }
    const int64_t left = hi - base;
    const int rows = left < kChunk ? static_cast<int>(left) : kChunk;
#pragma unroll 4
    for (int r = 0; r < rows; ++r) {
      const int64_t row_slot = __shfl_sync(0xffffffffu, slot, r);
      float vv[kPer];
      LoadRow<kPer>(v_base + row_slot * width, vv);
#pragma unroll
      for (int c = 0; c < kHeadsPerBlock; ++c) {
        const float p = p_s[warp][c][r];
#pragma unroll
        for (int u = 0; u < kPer; ++u) acc[c][u] += p * vv[u];
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int c = 0; c < kHeadsPerBlock; ++c) {
    float sum = l[c];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      merge_m[warp][c] = m[c];
      merge_l[warp][c] = sum;
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) merge_o[warp][c][lane * kPer + u] = acc[c][u];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < count * D; idx += blockDim.x) {
    const int c = idx / D, e = idx % D;
    float mx = -INFINITY;
    for (int w = 0; w < kAttendWarps; ++w) mx = fmaxf(mx, merge_m[w][c]);
    float total = 0.0f, o = 0.0f;
    for (int w = 0; w < kAttendWarps; ++w) {
      const float f = merge_m[w][c] == -INFINITY ? 0.0f : expf(merge_m[w][c] - mx);
      total += merge_l[w][c] * f;
      o += merge_o[w][c][e] * f;
    }
    const int64_t h = hs + c - h0;
    if (splits == 1) {
      out[(tok * nh + h) * D + e] = o / total;
    } else {
      float* part = partial + ((tok * nh + h) * splits + split) * (D + 2);
      if (e == 0) {
        part[0] = mx;
        part[1] = total;
      }
      part[2 + e] = o;
    }
  }
}

// GqaAttend on bf16 tensor cores, for a bf16 model (Backend::AllowTf32) with a bf16 cache: the
// same blocks and outputs, up to 16 heads of one KV head per block (the mma's 16 rows; fewer
// heads leave rows idle). Each warp takes chunks of 32 positions (chunk c of the split to warp
// c mod 4), copies the chunk's k and v rows into its own shared memory (cp.async), then
// S = q·kᵀ (16 x 32: 4 n-tiles x D/16 k-steps of m16n8k16), the online softmax on S's fragments
// (a row's 8 values per lane, its 4 lanes a quad), and O += P·v with P's fragments reused as
// the A operand (bf16) and v's read by ldmatrix.trans. q and P are rounded to bf16 as the
// model's own tensors are; accumulation in fp32. The warps merge in shared memory at the end.
constexpr int kMmaRows = 16;

// Row stride of a staged k / v chunk (bf16): 16 bytes of padding, so that the 8 rows an
// ldmatrix or a fragment load reads start in different banks.
template <int D>
__host__ __device__ constexpr int MmaStride() {
  return D + 8;
}
template <int D>
size_t MmaSmemBytes() {
  const size_t stage = 2 * kChunk * MmaStride<D>() * 2;  // k and v of one chunk
  const size_t merge = (2 * kMmaRows + kMmaRows * D) * sizeof(float);
  return kAttendWarps * (stage > merge ? stage : merge);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The rows of an mma tile: half 0 (rows 0-7) and half 1 (rows 8-15), each `count` heads from
// `head` of one token (count 0: idle), both tokens of one sequence (they share its k / v rows).
struct TileHalf {
  int64_t token = 0, head = 0;
  int count = 0;
};

// One tile's attention over split `split` of its context (GqaAttendMma's contract), the results
// of its rows written to out (one split) or partial.
template <int D>
__device__ __forceinline__ void MmaTile(const float* q, int64_t heads, int64_t kvh,
                                        const PagedArgs& t, const __nv_bfloat16* cache, int64_t g,
                                        int64_t h0, int64_t nh, float scale, int64_t split,
                                        int64_t splits, const TileHalf (&half)[2],
                                        unsigned char* smem_raw, float* partial, float* out) {
  constexpr int kSteps = D / 16, kTiles = D / 8, kStride = MmaStride<D>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
  constexpr size_t kStage = 2 * kChunk * kStride * 2;
  constexpr size_t kMerge = (2 * kMmaRows + kMmaRows * D) * sizeof(float);
  unsigned char* mine = smem_raw + warp * (kStage > kMerge ? kStage : kMerge);
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(mine);
  __nv_bfloat16* v_s = k_s + kChunk * kStride;
  // q of rows gid (half 0) and gid + 8 (half 1), pre-scaled, as A fragments.
  uint32_t qa[kSteps][4];
  {
    const bool r0 = gid < half[0].count, r1 = gid < half[1].count;
    const float* q0 = q + (half[0].token * heads + half[0].head + gid) * D;
    const float* q1 = q + (half[1].token * heads + half[1].head + gid) * D;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const int c = kk * 16 + 2 * tq;
      qa[kk][0] = r0 ? PackBf16(q0[c] * scale, q0[c + 1] * scale) : 0u;
      qa[kk][1] = r1 ? PackBf16(q1[c] * scale, q1[c + 1] * scale) : 0u;
      qa[kk][2] = r0 ? PackBf16(q0[c + 8] * scale, q0[c + 9] * scale) : 0u;
      qa[kk][3] = r1 ? PackBf16(q1[c + 8] * scale, q1[c + 9] * scale) : 0u;
    }
  }
  // Each half masks its own causal length; the split's range is cut from the longer one.
  const int64_t len0 = t.positions[half[0].token] + 1;
  const int64_t len1 = half[1].count > 0 ? t.positions[half[1].token] + 1 : 0;
  const int64_t len = max(len0, len1);
  const int64_t span = (len + splits - 1) / splits;
  const int64_t lo = split * span;
  const int64_t hi_half[2] = {min(len0, lo + span), min(len1, lo + span)};
  const int64_t hi = max(hi_half[0], hi_half[1]);
  const int32_t* table = t.block_tables + t.seq_index[half[0].token] * t.max_blocks;
  const int64_t width = 2 * kvh * D;
  float o[kTiles][4];
#pragma unroll
  for (int n = 0; n < kTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  constexpr int kVecs = D / 8;  // 16-byte pieces of a row
  for (int64_t base = lo + warp * kChunk; base < hi; base += kAttendWarps * kChunk) {
    // Stage the chunk's rows (positions past hi as zeros); lane r finds row r's slot.
    const int64_t jl = base + lane;
    const int64_t lane_slot =
        jl < hi ? static_cast<int64_t>(table[jl / t.block_size]) * t.block_size + jl % t.block_size
                : 0;
    for (int i = lane; i < kChunk * kVecs; i += 32) {
      const int r = i / kVecs, piece = i % kVecs;
      const bool valid = base + r < hi;
      const int64_t slot = __shfl_sync(0xffffffffu, lane_slot, r);
      const __nv_bfloat16* row = cache + slot * width;
      CopyAsync16Or0(k_s + r * kStride + piece * 8, row + g * D + piece * 8, valid);
      CopyAsync16Or0(v_s + r * kStride + piece * 8, row + (kvh + g) * D + piece * 8, valid);
    }
    CopyAsyncWaitAll();
    __syncwarp();
    // S = q·kᵀ: 4 n-tiles of 8 positions.
    float sc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
      const __nv_bfloat16* krow = k_s + (nt * 8 + gid) * kStride + 2 * tq;
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + kk * 16);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + kk * 16 + 8);
        MmaBf16(sc[nt], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
      }
    }
    // Online softmax: rows gid (c0, c1: half 0) and gid + 8 (c2, c3: half 1); position
    // nt·8 + 2·tq + {0, 1}, masked past its half's length.
    float corr[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool valid = base + nt * 8 + 2 * tq + e < hi_half[hf];
          float& v = sc[nt][2 * hf + e];
          v = valid ? v : -INFINITY;
          mx = fmaxf(mx, v);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hf], mx);
      // A half with nothing in this chunk (past its length) keeps its state.
      corr[hf] = m_new == -INFINITY ? 1.0f : expf(m[hf] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = sc[nt][2 * hf + e];
          v = v == -INFINITY ? 0.0f : expf(v - m_new);
          sum += v;
        }
      }
      l[hf] = l[hf] * corr[hf] + sum;
      m[hf] = m_new;
    }
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      o[n][0] *= corr[0], o[n][1] *= corr[0], o[n][2] *= corr[1], o[n][3] *= corr[1];
    }
    // O += P·v: 2 k-steps of 16 positions; v's B fragments by ldmatrix.trans, two n-tiles a call.
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const uint32_t a0 = PackBf16(sc[2 * ks][0], sc[2 * ks][1]);
      const uint32_t a1 = PackBf16(sc[2 * ks][2], sc[2 * ks][3]);
      const uint32_t a2 = PackBf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
      const uint32_t a3 = PackBf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
      const int mat = lane >> 3, r = lane & 7;
      const __nv_bfloat16* vrow = v_s + (ks * 16 + (mat & 1) * 8 + r) * kStride + (mat >> 1) * 8;
#pragma unroll
      for (int n = 0; n < kTiles; n += 2) {
        uint32_t b[4];
        Ldsm4T(b, vrow + n * 8);
        MmaBf16(o[n], a0, a1, a2, a3, b[0], b[1]);
        MmaBf16(o[n + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
    __syncwarp();
  }
  // Each row's sum over its quad; then the warps merge: m, l, O per row in shared memory.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
  }
  __syncthreads();                                // every warp is done with its stage buffers
  float* merge = reinterpret_cast<float*>(mine);  // [m 16 | l 16 | O 16 x D]
  if (tq == 0) {
    merge[gid] = m[0], merge[gid + 8] = m[1];
    merge[kMmaRows + gid] = l[0], merge[kMmaRows + gid + 8] = l[1];
  }
  float* om = merge + 2 * kMmaRows;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    const int c = n * 8 + 2 * tq;
    om[gid * D + c] = o[n][0], om[gid * D + c + 1] = o[n][1];
    om[(gid + 8) * D + c] = o[n][2], om[(gid + 8) * D + c + 1] = o[n][3];
  }
  __syncthreads();
  constexpr size_t kWarpFloats = (kStage > kMerge ? kStage : kMerge) / sizeof(float);
  const float* all = reinterpret_cast<const float*>(smem_raw);
  for (int idx = threadIdx.x; idx < kMmaRows * D; idx += blockDim.x) {
    const int row = idx / D, e = idx % D, hf = row / 8;
    if (row % 8 >= half[hf].count) continue;
    float mx = -INFINITY;
    for (int w = 0; w < kAttendWarps; ++w) mx = fmaxf(mx, all[w * kWarpFloats + row]);
    float total = 0.0f, acc = 0.0f;
    for (int w = 0; w < kAttendWarps; ++w) {
      const float* mw = all + w * kWarpFloats;
      const float f = mw[row] == -INFINITY ? 0.0f : expf(mw[row] - mx);
      total += mw[kMmaRows + row] * f;
      acc += mw[2 * kMmaRows + row * D + e] * f;
    }
    const int64_t tok = half[hf].token, h = half[hf].head + row % 8 - h0;
    if (splits == 1) {
      out[(tok * nh + h) * D + e] = acc / total;
    } else {
      float* part = partial + ((tok * nh + h) * splits + split) * (D + 2);
      if (e == 0) {
        part[0] = mx;
        part[1] = total;
      }
      part[2 + e] = acc;
    }
  }
  __syncthreads();  // the merge buffers are read before a next tile stages into them
}

// Block (token, or two tokens when kPair, head block of up to 16 heads of one KV head, split).
// kPair (prefill steps, at most 8 heads a block): the two tokens' heads fill the tile's two
// halves when both are of one sequence (they share its k / v rows); tokens of two sequences run
// one after the other.
template <int D, bool kPair>
__global__ void __launch_bounds__(kAttendWarps * 32)
    GqaAttendMma(const float* q, int64_t n, int64_t heads, int64_t kvh, PagedArgs t,
                 const __nv_bfloat16* cache, int64_t h0, int64_t h1, float scale, int64_t splits,
                 float* partial, float* out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  PdlStart();
  const int64_t split = blockIdx.z, group = heads / kvh, nh = h1 - h0;
  int64_t g, hs, he;
  BlockHeads<kPair ? 8 : kMmaRows>(blockIdx.y, group, h0, h1, &g, &hs, &he);
  const int count = static_cast<int>(he - hs);
  if constexpr (!kPair) {
    const int64_t tok = blockIdx.x;
    const TileHalf half[2] = {{tok, hs, min(count, 8)}, {tok, hs + 8, max(count - 8, 0)}};
    MmaTile<D>(q, heads, kvh, t, cache, g, h0, nh, scale, split, splits, half, smem_raw, partial,
               out);
  } else {
    const int64_t a = 2 * static_cast<int64_t>(blockIdx.x), b = a + 1;
    if (b < n && t.seq_index[a] == t.seq_index[b]) {
      const TileHalf half[2] = {{a, hs, count}, {b, hs, count}};
      MmaTile<D>(q, heads, kvh, t, cache, g, h0, nh, scale, split, splits, half, smem_raw, partial,
                 out);
    } else {
      const TileHalf first[2] = {{a, hs, count}, {a, hs, 0}};
      MmaTile<D>(q, heads, kvh, t, cache, g, h0, nh, scale, split, splits, first, smem_raw, partial,
                 out);
      if (b < n) {
        const TileHalf second[2] = {{b, hs, count}, {b, hs, 0}};
        MmaTile<D>(q, heads, kvh, t, cache, g, h0, nh, scale, split, splits, second, smem_raw,
                   partial, out);
      }
    }
  }
}

// Block (token, head): out = Σ_s e^{m_s - M} o_s / Σ_s e^{m_s - M} l_s over the splits (empty
// splits, m = -inf, weigh nothing).
__global__ void GqaMerge(int64_t d, int64_t nh, int64_t splits, const float* partial, float* out) {
  PdlStart();
  const int64_t tok = blockIdx.x, h = blockIdx.y;
  const float* part = partial + (tok * nh + h) * splits * (d + 2);
  float mx = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) mx = fmaxf(mx, part[s * (d + 2)]);
  float total = 0.0f;
  for (int64_t s = 0; s < splits; ++s) {
    const float m = part[s * (d + 2)];
    total += m == -INFINITY ? 0.0f : part[s * (d + 2) + 1] * expf(m - mx);
  }
  for (int64_t e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const float m = part[s * (d + 2)];
      if (m != -INFINITY) o += part[s * (d + 2) + 2 + e] * expf(m - mx);
    }
    out[(tok * nh + h) * d + e] = o / total;
  }
}

// Attention blocks over heads [h0, h1) (BlockHeads' numbering).
int64_t HeadBlocks(int64_t heads, int64_t kvh, int64_t h0, int64_t h1,
                   int64_t max_heads = kHeadsPerBlock) {
  const int64_t group = heads / kvh, chunk = std::min<int64_t>(group, max_heads);
  const int64_t per_group = (group + chunk - 1) / chunk;
  const auto id = [&](int64_t h) { return (h / group) * per_group + (h % group) / chunk; };
  return id(h1 - 1) - id(h0) + 1;
}

template <int PER, typename T>
void Attend(dim3 grid, cudaStream_t s, const float* q, int64_t heads, int64_t kvh, int64_t d,
            const PagedArgs& t, const void* cache, int64_t h0, int64_t h1, float scale,
            int64_t splits, float* partial, float* out) {
  LaunchPdl(GqaAttend<PER, T>, grid, kAttendWarps * 32, 0, s, q, heads, kvh, d, t,
            static_cast<const T*>(cache), h0, h1, scale, splits, partial, out);
}

}  // namespace

void LaunchGqaCacheWrite(const float* qkv, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                         const float* q_norm, const float* k_norm, float eps, const PagedArgs& t,
                         const RopeArgs& rope, float* q, void* cache, bool bf16_cache,
                         cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(d <= kGqaMaxHeadDim, "GqaCacheWrite on cuda: head_dim {} above {}", d, kGqaMaxHeadDim);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads + kvh));
  if (bf16_cache) {
    LaunchPdl(GqaWrite<__nv_bfloat16>, grid, kWriteThreads, 0, s, qkv, heads, kvh, d, q_norm,
              k_norm, eps, t, rope, q, static_cast<__nv_bfloat16*>(cache));
  } else {
    LaunchPdl(GqaWrite<float>, grid, kWriteThreads, 0, s, qkv, heads, kvh, d, q_norm, k_norm, eps,
              t, rope, q, static_cast<float*>(cache));
  }
  CheckLaunch("GqaCacheWrite");
}

GqaForm GqaChooseForm(int64_t d, bool bf16_cache, bool tf32, int64_t n, int64_t seqs) {
  GqaForm f;
  f.tensor_cores = tf32 && bf16_cache && (d == 64 || d == 128 || d == 256);
  f.pairs = f.tensor_cores && d <= 128 && n >= 2 * seqs;  // (256: the pair form spills)
  return f;
}

namespace {

// Blocks along x (tokens, or token pairs) and y (head blocks) of a form.
int64_t TokenBlocks(int64_t n, const GqaForm& f) { return f.pairs ? (n + 1) / 2 : n; }
int64_t FormHeadBlocks(int64_t heads, int64_t kvh, int64_t h0, int64_t h1, const GqaForm& f) {
  return HeadBlocks(heads, kvh, h0, h1,
                    f.tensor_cores ? (f.pairs ? kMmaRows / 2 : kMmaRows) : kHeadsPerBlock);
}

}  // namespace

int64_t GqaSplits(int64_t n, int64_t heads, int64_t kvh, int64_t h0, int64_t h1,
                  int64_t max_context, const GqaForm& form, int sm_count) {
  const int64_t blocks = TokenBlocks(n, form) * FormHeadBlocks(heads, kvh, h0, h1, form);
  // Enough blocks for two waves of the device, each split at least 128 positions long (a chunk
  // of 32 for each of a block's warps).
  const int64_t want = (2 * static_cast<int64_t>(sm_count) + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, (max_context + 127) / 128);
  return std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 64));
}

int64_t GqaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t d) {
  return splits > 1 ? n * nh * splits * (d + 2) : 0;
}

void LaunchGqaAttention(const float* q, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                        const PagedArgs& t, const void* cache, bool bf16_cache, int64_t h0,
                        int64_t h1, float scale, int64_t splits, const GqaForm& form,
                        float* partial, float* out, cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(d <= kGqaMaxHeadDim, "GqaAttention on cuda: head_dim {} above {}", d, kGqaMaxHeadDim);
  const bool tensor_cores = form.tensor_cores;
  const dim3 grid(static_cast<unsigned>(TokenBlocks(n, form)),
                  static_cast<unsigned>(FormHeadBlocks(heads, kvh, h0, h1, form)),
                  static_cast<unsigned>(splits));
  const auto mma = [&](auto dim, auto pairs) {
    constexpr int kD = decltype(dim)::value;
    constexpr bool kPairs = decltype(pairs)::value;
    const size_t smem = MmaSmemBytes<kD>();
    static const bool configured = [smem] {
      AFD_CUDA_CHECK(cudaFuncSetAttribute(GqaAttendMma<kD, kPairs>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
      return true;
    }();
    (void)configured;
    LaunchPdl(GqaAttendMma<kD, kPairs>, grid, kAttendWarps * 32, smem, s, q, n, heads, kvh, t,
              static_cast<const __nv_bfloat16*>(cache), h0, h1, scale, splits, partial, out);
  };
  const auto mma_dims = [&](auto pairs) {
    if (d == 64) {
      mma(std::integral_constant<int, 64>{}, pairs);
    } else if (d == 128) {
      mma(std::integral_constant<int, 128>{}, pairs);
    } else if constexpr (!decltype(pairs)::value) {
      mma(std::integral_constant<int, 256>{}, pairs);
    }
  };
  const auto chunks = [&](auto dim) {
    constexpr int kD = decltype(dim)::value;
    if (bf16_cache) {
      LaunchPdl(GqaAttendChunks<kD, __nv_bfloat16>, grid, kAttendWarps * 32, 0, s, q, heads, kvh, t,
                static_cast<const __nv_bfloat16*>(cache), h0, h1, scale, splits, partial, out);
    } else {
      LaunchPdl(GqaAttendChunks<kD, float>, grid, kAttendWarps * 32, 0, s, q, heads, kvh, t,
                static_cast<const float*>(cache), h0, h1, scale, splits, partial, out);
    }
  };
  const auto launch = [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    if (bf16_cache) {
      Attend<kPer, __nv_bfloat16>(grid, s, q, heads, kvh, d, t, cache, h0, h1, scale, splits,
                                  partial, out);
    } else {
      Attend<kPer, float>(grid, s, q, heads, kvh, d, t, cache, h0, h1, scale, splits, partial, out);
    }
  };
  if (tensor_cores) {
    AFD_CHECK(GqaChooseForm(d, bf16_cache, true, 1, 1).tensor_cores,
              "GqaAttention on cuda: no tensor-core form for head_dim {} (bf16 cache {})", d,
              bf16_cache);
    if (form.pairs) {
      AFD_CHECK(d <= 128, "GqaAttention on cuda: no token-pair form for head_dim {}", d);
      mma_dims(std::true_type{});
    } else {
      mma_dims(std::false_type{});
    }
  } else if (d == 32) {
    chunks(std::integral_constant<int, 32>{});
  } else if (d == 64) {
    chunks(std::integral_constant<int, 64>{});
  } else if (d == 128) {
    chunks(std::integral_constant<int, 128>{});
  } else if (d == 256) {
    chunks(std::integral_constant<int, 256>{});
  } else if (d <= 32) {
    launch(std::integral_constant<int, 1>{});
  } else if (d <= 64) {
    launch(std::integral_constant<int, 2>{});
  } else if (d <= 128) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
  CheckLaunch("GqaAttention");
  if (splits > 1) {
    LaunchPdl(GqaMerge, dim3(static_cast<unsigned>(n), static_cast<unsigned>(h1 - h0)), 128, 0, s,
              d, h1 - h0, splits, partial, out);
    CheckLaunch("GqaAttention merge");
  }
}

}  // namespace afd::kernels::cuda

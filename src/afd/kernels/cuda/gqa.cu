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
#include "afd/kernels/cuda/launch.cuh"
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
__device__ __forceinline__ void BlockHeads(int64_t b, int64_t group, int64_t h0, int64_t h1,
                                           int64_t* g, int64_t* hs, int64_t* he) {
  const int64_t chunk = group < kHeadsPerBlock ? group : kHeadsPerBlock;
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
    const int64_t slot = static_cast<int64_t>(table[j / t.block_size]) * t.block_size +
                         j % t.block_size;
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

// Block (token, head): out = Σ_s e^{m_s - M} o_s / Σ_s e^{m_s - M} l_s over the splits (empty
// splits, m = -inf, weigh nothing).
__global__ void GqaMerge(int64_t d, int64_t nh, int64_t splits, const float* partial,
                         float* out) {
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
int64_t HeadBlocks(int64_t heads, int64_t kvh, int64_t h0, int64_t h1) {
  const int64_t group = heads / kvh, chunk = std::min<int64_t>(group, kHeadsPerBlock);
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

int64_t GqaSplits(int64_t n, int64_t heads, int64_t kvh, int64_t h0, int64_t h1,
                  int64_t max_context, int sm_count) {
  const int64_t blocks = n * HeadBlocks(heads, kvh, h0, h1);
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
                        int64_t h1, float scale, int64_t splits, float* partial, float* out,
                        cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(d <= kGqaMaxHeadDim, "GqaAttention on cuda: head_dim {} above {}", d, kGqaMaxHeadDim);
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>(HeadBlocks(heads, kvh, h0, h1)),
                  static_cast<unsigned>(splits));
  const auto chunks = [&](auto dim) {
    constexpr int kD = decltype(dim)::value;
    if (bf16_cache) {
      LaunchPdl(GqaAttendChunks<kD, __nv_bfloat16>, grid, kAttendWarps * 32, 0, s, q, heads, kvh,
                t, static_cast<const __nv_bfloat16*>(cache), h0, h1, scale, splits, partial, out);
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
      Attend<kPer, float>(grid, s, q, heads, kvh, d, t, cache, h0, h1, scale, splits, partial,
                          out);
    }
  };
  if (d == 32) {
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

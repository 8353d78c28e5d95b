// Absorbed MLA decode, the chunked form (AttentionPartial) for every shape and precision, and
// the merge of its splits (AttentionCombine); mla_decode.cuh.
#include <cuda.h>  // CUtensorMap (encoded through the runtime's driver entry point)
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/elementwise.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/mla_decode.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/pdl.cuh"
#include "afd/kernels/cuda/rope.cuh"

namespace afd::kernels::cuda {

namespace {

// Absorbed MLA decode, all heads of a group per block (the heads share every latent row, so
// each row is read from memory once per token, not once per head). Block (token, head group,
// split) attends positions [split·span, min((split+1)·span, len)) in chunks of kRows rows:
// stages the chunk's rows in shared memory, scores them for every head (below), updates each
// head's running max and sum, and accumulates o_lat[h][l] in registers (thread owns latent
// columns l = tid and tid + 256 for every head). q_lat = W_kᵀ·q_nope comes in precomputed
// ([n, nh, kvr]). Writes partial[((t·nh + h)·splits + split)] = [m | l | o_lat[kvr]] like the
// merge below expects; an empty range writes m = -FLT_MAX, l = 0.
// Latency, not bandwidth, bounds this at decode sizes, so every global load is issued before any
// is used: each thread's share of the q rows and of a chunk's rows is loaded into registers in
// one go (kMaxPer 16-byte loads in flight), and the next chunk's rows are in flight while the
// current one is scored and accumulated.
// Scores: thread (th, tj, slice) sums heads 2th, 2th + 1 against rows 2tj, 2tj + 1 over the
// float4 columns ≡ slice (mod 4), the 4 slices (lanes xor 1, 2) then added by shuffles: a
// register tile reads a quarter of the shared memory a thread per score did (that took ~5 us
// a chunk). Warp th holds heads 2th, 2th + 1 for every row, so a head's max and sum over the
// chunk are shuffles too.
// Shared memory: q[G][stride] | rows[kRows][stride] | p[G][kRows] (AttnStride).
constexpr int kMaxPer = (kRows * kMaxWidth / 4 + kAttnThreads - 1) / kAttnThreads;
static_assert(kGroup == kRows, "the q rows and a chunk's rows are staged by one helper");

// Row stride in shared memory: a multiple of 4 past width (a pad column holds each head's
// rescale) with stride ≡ 8 (mod 16) floats, so rows 2j and 2j + 2 start 16 banks apart: the
// 16-byte reads of a quarter-warp in the score loop (2 rows x 4 column slices) hit 32 banks.
__host__ __device__ int AttnStride(int64_t width) {
  return static_cast<int>((width + 15) / 16 * 16 + 8);
}

// The tensor-core form adds the score partials of its 4 k-quarters: [4][kGroup][kRows].
constexpr int kTcQuarters = 4;

size_t AttnSmemBytes(int64_t width, bool tc) {
  return (static_cast<size_t>(kGroup + kRows) * AttnStride(width) + kGroup * kRows +
          (tc ? kTcQuarters * kGroup * kRows : 0)) *
         sizeof(float);
}

// Thread tid's share of a [kRows, w4] tile of 4-value vectors V: elements e = tid + u·kAttnThreads,
// row e / w4. `load(row, c4)` gives the V. W4: the tile's width when known at compile time
// (DeepSeek's 512 + 64 = 144 vectors: every index is then a multiply-shift), else 0 and w4 at
// run time.
template <int W4, typename V, typename Load>
__device__ __forceinline__ void LoadTile(V (&v)[kMaxPer], int w4, Load load) {
  if constexpr (W4 > 0) w4 = W4;
#pragma unroll
  for (int u = 0; u < kMaxPer; ++u) {
    const int e = threadIdx.x + u * kAttnThreads;
    if (e < kRows * w4) v[u] = load(e / w4, e % w4);
  }
}

// 4 values as fp32: a float4 as is, 4 bf16 (a uint2 as loaded from a bf16 cache) widened exactly.
__device__ __forceinline__ float4 ToFloat4(float4 v) { return v; }
__device__ __forceinline__ float4 ToFloat4(uint2 u) {
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// The tile into shared memory as fp32 rows of `stride` floats.
template <int W4, typename V>
__device__ __forceinline__ void StoreTile(const V (&v)[kMaxPer], int w4, int stride, float* tile) {
  if constexpr (W4 > 0) w4 = W4;
#pragma unroll
  for (int u = 0; u < kMaxPer; ++u) {
    const int e = threadIdx.x + u * kAttnThreads;
    if (e < kRows * w4) {
      const int r = e / w4, c4 = e % w4;
      reinterpret_cast<float4*>(tile + r * stride)[c4] = ToFloat4(v[u]);
    }
  }
}

// A cache row's values 4·c4 .. 4·c4 + 3 as loaded (16 bytes of fp32 or 8 of bf16): kept raw in
// registers while in flight and widened only when stored to shared memory, so the next chunk's
// loads do not stall the current chunk on a conversion.
template <typename CT>
using CacheVec = std::conditional_t<std::is_same_v<CT, float>, float4, uint2>;
template <typename CT>
__device__ __forceinline__ CacheVec<CT> LoadCache4(const CT* row, int c4) {
  return reinterpret_cast<const CacheVec<CT>*>(row)[c4];
}

//
// kTc (bf16 models, Backend::AllowTf32): the chunk's two products on tensor cores, TF32 inputs
// (10-bit mantissa: finer than the bf16 the model's weights have) with fp32 accumulation, the
// same blocks, chunks, pipeline and partial layout. Scores S[16 heads x 16 rows] = q · rowsᵀ:
// warp w takes the 8 rows 8 (w & 1).. over the k-quarter w >> 1 of the width (m16n8k8), the 4
// quarters added in a fixed order; one thread per (head, row) then does the online softmax. P·V:
// O[16 x kvr] += P[16 x 16] · rows[16 x kvr], warp w owning the 8-column tiles w, w + 8, ...
// (C fragments in registers, rescaled per head). Needs kvr and width multiples of 8.
//
// CT: the cache's rows, float or __nv_bfloat16 (8-byte loads of 4 values in place of the 16-byte
// float4 loads, widened exactly to fp32 on the way to shared memory).
template <int W4, bool kTc, typename CT>
__global__ void __launch_bounds__(kAttnThreads, 2)
    AttentionPartial(const float* q, int64_t heads, const float* q_lat, int64_t kvr, int64_t dn,
                     int64_t dr, PagedArgs t, const CT* cache, int64_t h0, int64_t nh, float scale,
                     int64_t span, float* partial) {
  PdlStart();
  extern __shared__ float4 smem4[];
  __shared__ int64_t slots[2][kRows];  // cache slots of this chunk's rows and the next one's
  float* smem = reinterpret_cast<float*>(smem4);
  const int width = W4 > 0 ? 4 * W4 : static_cast<int>(kvr + dr);
  const int stride = AttnStride(width), w4 = width / 4;
  const int kv4 = static_cast<int>(kvr / 4);
  float* qs = smem;                    // [kGroup][stride]
  float* rows = qs + kGroup * stride;  // [kRows][stride]
  float* ps = rows + kRows * stride;   // [kGroup][kRows]
  const int64_t tok = blockIdx.x, g0 = int64_t(blockIdx.y) * kGroup;
  const int g_count = static_cast<int>(min(static_cast<int64_t>(kGroup), nh - g0));
  const int64_t splits = gridDim.z, split = blockIdx.z;
  const int64_t len = t.positions[tok] + 1, seq = t.seq_index[tok];
  const int64_t j_begin = split * span, j_end = min(len, j_begin + span);
  const int tid = threadIdx.x;
  if (j_begin >= j_end) {
    for (int h = 0; h < g_count; ++h) {
      float* part = partial + ((tok * nh + g0 + h) * splits + split) * (kvr + 2);
      if (tid == 0) {
        part[0] = -FLT_MAX;
        part[1] = 0.0f;
      }
      for (int64_t l = tid; l < kvr; l += kAttnThreads) part[2 + l] = 0.0f;
    }
    return;
  }
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int32_t* table = t.block_tables + seq * t.max_blocks;
  const int block_size = static_cast<int>(t.block_size);
  // Threads 0..kRows-1 look up the cache slots of chunk c's rows into slots[c & 1].
  const auto find_slots = [&](int64_t j0, int c) {
    if (tid < kRows && j0 + tid < j_end) {
      const int j = static_cast<int>(j0 + tid);
      slots[c & 1][tid] = int64_t(table[j / block_size]) * block_size + j % block_size;
    }
  };
  // The rows of chunk c (positions j0 ...; zeros past j_end), as registers.
  using Vec = CacheVec<CT>;
  const auto load_chunk = [&](Vec(&v)[kMaxPer], int64_t j0, int c) {
    LoadTile<W4>(v, w4, [&](int jj, int c4) {
      if (j0 + jj >= j_end) return Vec{};
      return LoadCache4(cache + slots[c & 1][jj] * width, c4);
    });
  };
  find_slots(j_begin, 0);
  {
    // q rows of the group: [q_lat | q_pe], zeros for heads past the group's end.
    float4 qv[kMaxPer];
    LoadTile<W4>(qv, w4, [&](int h, int c4) {
      if (h >= g_count) return zero4;
      if (c4 < kv4) return reinterpret_cast<const float4*>(q_lat + (tok * nh + g0 + h) * kvr)[c4];
      return reinterpret_cast<const float4*>(q + (tok * heads + h0 + g0 + h) * (dn + dr) +
                                             dn)[c4 - kv4];
    });
    StoreTile<W4>(qv, w4, stride, qs);
  }
  Vec v[kMaxPer];
  __syncthreads();  // slots[0]
  load_chunk(v, j_begin, 0);
  [[maybe_unused]] const int slice = tid & 3, tj = (tid >> 2) & 7, th = tid >> 5;
  float m[2] = {-FLT_MAX, -FLT_MAX}, lsum[2] = {0.0f, 0.0f};  // of heads 2th, 2th + 1
  // Tensor cores: per warp kTcTiles 8-column tiles of O (C fragments); the softmax thread of
  // (head tid / 16, row tid % 16) keeps its head's running max and sum in m[0], lsum[0].
  constexpr int kTcTiles = kMaxLatent / 8 / (kAttnThreads / 32);
  constexpr int kAccRows = kTc ? 1 : kGroup, kAccCols = kTc ? 1 : 2;
  float acc[kAccRows][kAccCols];
  float tacc[kTc ? kTcTiles : 1][4];
#pragma unroll
  for (int h = 0; h < kAccRows; ++h) acc[h][0] = acc[h][kAccCols - 1] = 0.0f;
#pragma unroll
  for (int i = 0; i < (kTc ? kTcTiles : 1); ++i)
    tacc[i][0] = tacc[i][1] = tacc[i][2] = tacc[i][3] = 0.0f;
  [[maybe_unused]] const int lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tq = lane & 3;
  int c = 0;  // chunk index
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kRows, ++c) {
    const int64_t cnt = min(static_cast<int64_t>(kRows), j_end - j0);
    __syncthreads();  // the previous chunk's rows and p are consumed
    StoreTile<W4>(v, w4, stride, rows);
    if (j0 + kRows < j_end) find_slots(j0 + kRows, c + 1);
    __syncthreads();
    if (j0 + kRows < j_end) load_chunk(v, j0 + kRows, c + 1);  // in flight while this one is used
    if constexpr (kTc) {
      float* sred = ps + kGroup * kRows;  // [kTcQuarters][kGroup][kRows]
      {
        const int nt = warp & 1, quarter = warp >> 1, ksteps = width / 8;
        const int k_lo = quarter * ksteps / kTcQuarters,
                  k_hi = (quarter + 1) * ksteps / kTcQuarters;
        const float* qa = qs + gid * stride + tq;
        const float* rb = rows + (8 * nt + gid) * stride + tq;
        float sc4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int ks = k_lo; ks < k_hi; ++ks) {
          const int k0 = 8 * ks;
          MmaTf32(sc4, Tf32(qa[k0]), Tf32(qa[8 * stride + k0]), Tf32(qa[k0 + 4]),
                  Tf32(qa[8 * stride + k0 + 4]), Tf32(rb[k0]), Tf32(rb[k0 + 4]));
        }
        float* out = sred + quarter * kGroup * kRows + 8 * nt + 2 * tq;
        out[gid * kRows] = sc4[0];
        out[gid * kRows + 1] = sc4[1];
        out[(gid + 8) * kRows] = sc4[2];
        out[(gid + 8) * kRows + 1] = sc4[3];
      }
      __syncthreads();
      {
        const int h = tid >> 4, j = tid & 15;  // one (head, row) per thread: 16 x 16
        float sc = 0.0f;
#pragma unroll
        for (int qq = 0; qq < kTcQuarters; ++qq) sc += sred[(qq * kGroup + h) * kRows + j];
        sc = j < cnt ? sc * scale : -INFINITY;
        float cmax = sc;
        for (int o = 1; o <= 8; o <<= 1) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, o));
        const float m_new = fmaxf(m[0], cmax);
        const float rescale = expf(m[0] - m_new);
        const float p = expf(sc - m_new);  // 0 past the chunk
        float csum = p;
        for (int o = 1; o <= 8; o <<= 1) csum += __shfl_xor_sync(0xffffffffu, csum, o);
        lsum[0] = lsum[0] * rescale + csum;
        m[0] = m_new;
        ps[h * kRows + j] = p;
        if (j == 0) qs[h * stride + width] = rescale;  // pad column
      }
      __syncthreads();
      {
        const float r_lo = qs[gid * stride + width], r_hi = qs[(gid + 8) * stride + width];
        uint32_t pa[2][4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          pa[ks][0] = Tf32(ps[gid * kRows + 8 * ks + tq]);
          pa[ks][1] = Tf32(ps[(gid + 8) * kRows + 8 * ks + tq]);
          pa[ks][2] = Tf32(ps[gid * kRows + 8 * ks + tq + 4]);
          pa[ks][3] = Tf32(ps[(gid + 8) * kRows + 8 * ks + tq + 4]);
        }
#pragma unroll
        for (int i = 0; i < kTcTiles; ++i) {
          const int col = 8 * (warp + i * (kAttnThreads / 32));
          if (col >= kvr) break;
          tacc[i][0] *= r_lo;
          tacc[i][1] *= r_lo;
          tacc[i][2] *= r_hi;
          tacc[i][3] *= r_hi;
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
            const float* vb = rows + (8 * ks + tq) * stride + col + gid;
            MmaTf32(tacc[i], pa[ks][0], pa[ks][1], pa[ks][2], pa[ks][3], Tf32(vb[0]),
                    Tf32(vb[4 * stride]));
          }
        }
      }
    } else {
      float sc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
      {
        const float4* qa = reinterpret_cast<const float4*>(qs + 2 * th * stride);
        const float4* ra = reinterpret_cast<const float4*>(rows + 2 * tj * stride);
        const int s4 = stride / 4;
        for (int c4 = slice; c4 < w4; c4 += 4) {
          const float4 a[2] = {qa[c4], qa[s4 + c4]}, b[2] = {ra[c4], ra[s4 + c4]};
#pragma unroll
          for (int x = 0; x < 2; ++x) {
#pragma unroll
            for (int y = 0; y < 2; ++y) {
              sc[x][y] += a[x].x * b[y].x;
              sc[x][y] += a[x].y * b[y].y;
              sc[x][y] += a[x].z * b[y].z;
              sc[x][y] += a[x].w * b[y].w;
            }
          }
        }
      }
      float rescale[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
#pragma unroll
        for (int y = 0; y < 2; ++y) {
          for (int o = 1; o <= 2; o <<= 1) sc[x][y] += __shfl_xor_sync(0xffffffffu, sc[x][y], o);
          sc[x][y] = 2 * tj + y < cnt ? sc[x][y] * scale : -INFINITY;
        }
        float cmax = fmaxf(sc[x][0], sc[x][1]);
        for (int o = 4; o <= 16; o <<= 1) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, o));
        const float m_new = fmaxf(m[x], cmax);
        rescale[x] = expf(m[x] - m_new);
        const float p0 = expf(sc[x][0] - m_new), p1 = expf(sc[x][1] - m_new);  // 0 past the chunk
        float csum = p0 + p1;
        for (int o = 4; o <= 16; o <<= 1) csum += __shfl_xor_sync(0xffffffffu, csum, o);
        lsum[x] = lsum[x] * rescale[x] + csum;
        m[x] = m_new;
        if (slice == 0) {
          ps[(2 * th + x) * kRows + 2 * tj] = p0;
          ps[(2 * th + x) * kRows + 2 * tj + 1] = p1;
        }
        if (slice == 0 && tj == 0) qs[(2 * th + x) * stride + width] = rescale[x];  // pad column
      }
      __syncthreads();
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const float r = qs[h * stride + width];
        acc[h][0] *= r;
        acc[h][1] *= r;
      }
#pragma unroll
      for (int jj = 0; jj < kRows; jj += 4) {
        float r0[4], r1[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          r0[u] = tid < kvr ? rows[(jj + u) * stride + tid] : 0.0f;
          r1[u] = tid + kAttnThreads < kvr ? rows[(jj + u) * stride + tid + kAttnThreads] : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
          const float4 p4 = reinterpret_cast<const float4*>(ps + h * kRows + jj)[0];
          const float ph[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            acc[h][0] += ph[u] * r0[u];
            acc[h][1] += ph[u] * r1[u];
          }
        }
      }
    }
  }
  if constexpr (kTc) {
    const int h = tid >> 4;
    if ((tid & 15) == 0 && h < g_count) {
      float* part = partial + ((tok * nh + g0 + h) * splits + split) * (kvr + 2);
      part[0] = m[0];
      part[1] = lsum[0];
    }
#pragma unroll
    for (int i = 0; i < kTcTiles; ++i) {
      const int col = 8 * (warp + i * (kAttnThreads / 32)) + 2 * tq;
      if (col >= kvr) break;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int hh = gid + 8 * half;
        if (hh >= g_count) continue;
        float* part = partial + ((tok * nh + g0 + hh) * splits + split) * (kvr + 2) + 2 + col;
        part[0] = tacc[i][2 * half];
        part[1] = tacc[i][2 * half + 1];
      }
    }
  } else {
    // Every lane of warp th holds the m and lsum of heads 2th, 2th + 1; lane 0 writes them.
    if ((tid & 31) == 0) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        if (2 * th + x >= g_count) break;
        float* part = partial + ((tok * nh + g0 + 2 * th + x) * splits + split) * (kvr + 2);
        part[0] = m[x];
        part[1] = lsum[x];
      }
    }
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h >= g_count) break;
      float* part = partial + ((tok * nh + g0 + h) * splits + split) * (kvr + 2);
      if (tid < kvr) part[2 + tid] = acc[h][0];
      if (tid + kAttnThreads < kvr) part[2 + tid + kAttnThreads] = acc[h][1];
    }
  }
}

// Block (token, head): merges the splits' partials into o_lat[t, h] =
// (Σ_s e^{m_s - M} o_s) / (Σ_s e^{m_s - M} l_s); W_v is applied by a batched GEMM after.
__global__ void AttentionCombine(int64_t kvr, int64_t nh, int64_t splits, const float* partial,
                                 float* o_lat) {
  PdlStart();
  const int64_t tok = blockIdx.x, h = blockIdx.y;
  const float* part = partial + (tok * nh + h) * splits * (kvr + 2);
  float mx = -FLT_MAX;
  for (int64_t s = 0; s < splits; ++s) mx = fmaxf(mx, part[s * (kvr + 2)]);
  float total = 0.0f;
  for (int64_t s = 0; s < splits; ++s) {
    total += part[s * (kvr + 2) + 1] * expf(part[s * (kvr + 2)] - mx);
  }
  float* out = o_lat + (tok * nh + h) * kvr;
  for (int64_t l = threadIdx.x; l < kvr; l += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      acc += part[s * (kvr + 2) + 2 + l] * expf(part[s * (kvr + 2)] - mx);
    }
    out[l] = acc / total;
  }
}

// The chunked kernel (AttentionPartial) for every other shape and precision.
void LaunchChunks(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t kvr,
                  int64_t dn, int64_t dr, const PagedArgs& t, const void* cache, bool bf16_cache,
                  int64_t h0, int64_t h1, float scale, int64_t max_context, int64_t splits,
                  bool tf32, float* partial, cudaStream_t s) {
  // TF32 tensor cores where allowed (bf16 models) and the shapes fit the mma tiles.
  const bool use_tc = tf32 && kvr % 8 == 0 && (kvr + dr) % 8 == 0;
  const size_t smem = AttnSmemBytes(kvr + dr, use_tc);
  // DeepSeek's width (512 + 64) has its own instances with constant index arithmetic.
  const bool wide = kvr + dr == 576;
  const int64_t nh = h1 - h0;
  // Whole chunks per split: positions [split·span, (split + 1)·span).
  const int64_t chunks = (max_context + kRows - 1) / kRows;
  const int64_t span = (chunks + splits - 1) / splits * kRows;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((nh + kGroup - 1) / kGroup),
                  static_cast<unsigned>(splits));
  // The opt-in above 48 KB of shared memory, raised once per instance and size.
  static size_t smem_set[2][2][2] = {};
  const auto launch = [&](auto kernel, const auto* rows) {
    size_t& set = smem_set[use_tc][wide][bf16_cache];
    if (smem > set) {
      AFD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
      set = smem;
    }
    LaunchPdl(kernel, grid, kAttnThreads, smem, s, q, heads, q_lat, kvr, dn, dr, t, rows, h0, nh,
              scale, span, partial);
  };
  const auto pick = [&](const auto* rows) {
    using CT = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    if (use_tc) {
      launch(wide ? AttentionPartial<144, true, CT> : AttentionPartial<0, true, CT>, rows);
    } else {
      launch(wide ? AttentionPartial<144, false, CT> : AttentionPartial<0, false, CT>, rows);
    }
  };
  if (bf16_cache) {
    pick(static_cast<const __nv_bfloat16*>(cache));
  } else {
    pick(static_cast<const float*>(cache));
  }
  CheckLaunch("MlaAttention (partial)");
}

}  // namespace

void LaunchMlaChunks(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t kvr,
                     int64_t dn, int64_t dr, const PagedArgs& t, const void* cache, bool bf16_cache,
                     int64_t h0, int64_t h1, float scale, int64_t max_context, int64_t splits,
                     bool tf32, float* partial, float* o_lat, cudaStream_t s) {
  LaunchChunks(q, n, heads, q_lat, kvr, dn, dr, t, cache, bf16_cache, h0, h1, scale, max_context,
               splits, tf32, partial, s);
  const int64_t nh = h1 - h0;
  const dim3 grid2(static_cast<unsigned>(n), static_cast<unsigned>(nh));
  LaunchPdl(AttentionCombine, grid2, kAttnThreads, 0, s, kvr, nh, splits, partial, o_lat);
  CheckLaunch("MlaAttention (combine)");
}

}  // namespace afd::kernels::cuda

// RoPE, MLA cache write and absorbed MLA attention over the paged latent cache (flash-decoding:
// every head of a group per block, the context split over blocks, one merge kernel; the W_k and
// W_v products around it are batched GEMMs in the backend, or for a few tokens the kernels
// MlaQLat / MlaOut here). DeepSeek's shape with a bf16 cache in a bf16 model runs a tiled kernel
// on bf16 tensor cores (AttentionTiles); every other case the chunked one (AttentionPartial).
#include <cuda.h>  // CUtensorMap (encoded through the runtime's driver entry point)
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/pdl.cuh"
#include "afd/kernels/cuda/rope.cuh"

namespace afd::kernels::cuda {

namespace {

__global__ void Rope(float* x, int64_t heads, int64_t width, int64_t offset, const int64_t* pos,
                     RopeArgs r) {
  PdlStart();
  const int64_t t = blockIdx.x, half = r.dim / 2;
  for (int64_t e = threadIdx.x; e < heads * half; e += blockDim.x) {
    RotatePair(x + (t * heads + e / half) * width + offset, r, pos[t], e % half);
  }
}

constexpr int kMaxRopeDim = 512;  // CacheWrite stages the rope key in shared memory

// A cache value from fp32: as is, or rounded to bf16 (round to nearest even, as on the CPU).
__device__ __forceinline__ void StoreCache(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreCache(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// One block per token: the normalised latent and the roped key, computed in fp32 (the rope key
// rotated in shared memory), stored as the cache's T.
template <typename T>
__global__ void CacheWrite(const float* ckv, int64_t kvr, const float* norm_w, float eps,
                           PagedArgs t, RopeArgs r, T* cache) {
  PdlStart();
  __shared__ float partial[32];
  __shared__ float pe[kMaxRopeDim];
  const int64_t i = blockIdx.x, width = kvr + r.dim;
  if (t.slot_mapping[i] < 0) return;  // a padding row of a captured graph
  const float* src = ckv + i * width;
  T* row = cache + t.slot_mapping[i] * width;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < kvr; j += blockDim.x) ss += src[j] * src[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += partial[w];
  const float inv = rsqrtf(total / kvr + eps);
  for (int64_t j = threadIdx.x; j < kvr; j += blockDim.x) {
    StoreCache(row + j, norm_w[j] * (src[j] * inv));
  }
  for (int64_t j = threadIdx.x; j < r.dim; j += blockDim.x) pe[j] = src[kvr + j];
  __syncthreads();
  if (threadIdx.x < r.dim / 2) RotatePair(pe, r, t.positions[i], threadIdx.x);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < r.dim; j += blockDim.x) StoreCache(row + kvr + j, pe[j]);
}

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
constexpr int kAttnThreads = 256;
constexpr int kGroup = 16;  // heads per block
constexpr int kRows = 16;   // positions per chunk (kGroup · kRows == kAttnThreads)
constexpr int kMaxLatent = 2 * kAttnThreads;
constexpr int kMaxWidth = 640;  // latent + rope dims (DeepSeek: 512 + 64)
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

// Absorbed MLA decode on bf16 tensor cores, DeepSeek's shape only (latent 512 + rope 64, a bf16
// cache; bf16 models, Backend::AllowTf32): the FlashMLA recipe on mma.sync. Block (token, head
// group of 16, split) walks its positions in tiles of kTileRows cache rows, loaded into shared
// memory by cp.async (rows past the end are zero-filled), 8 warps. kBufs == 2: double-buffered
// (the next tile's 72 KB in flight while this one is used), one block per SM (171 KB); kBufs ==
// 1, for grids of more blocks than SMs: the next tile loads once this one is used, two blocks per
// SM (95 KB each, <= 128 registers), one block computing while the other's tile lands (at 256
// tokens x context 1024 on the H200: 0.136 vs 0.149 ms, the op with W_k and W_v):
//   S [16 heads x 64 rows] = Q · tileᵀ: warp w the 8 rows 8w.., all 576 dims (36 k-steps of
//     m16n8k16, Q and the rows read by ldmatrix);
//   online softmax in base 2: each head's tile max across the warps through shared memory (the
//     only cross-warp step: every thread then holds the same running max m of its two heads);
//     each thread keeps partial sums l of its own columns, added over the block at the end;
//   P (bf16) through shared memory; O [16 x 512] += P · tile[:, :512]: warp w owns columns
//     64w .. 64w + 63 (8 C tiles in registers, rescaled per head as the max moves).
// Inputs are rounded to bf16 as a bf16 model holds them (q; the cache already is), P too, with
// fp32 accumulation. Partials as AttentionPartial writes them (m in natural-log units, l, and
// the unnormalised o_lat), so AttentionCombine merges the splits.
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

template <int kTok, int kBufs, bool kBulk>
__global__ void __launch_bounds__(kTileWarps * 32, 3 - kBufs)
    AttentionTiles(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t dn,
                   PagedArgs t, const __nv_bfloat16* cache, int64_t h0, int64_t nh,
                   float scale_log2, int64_t span, float* partial, int* counters, float* o_lat) {
  PdlStart();
  static_assert((kTok == 1 || kTok == 2) && (kBufs == 1 || kBufs == 2));
  constexpr int kM = kTok * kGroup;  // Q rows: token i's head hh at row 16 i + hh
  extern __shared__ float4 smem4[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem4);             // [kM][kTileStride]
  __nv_bfloat16* rows = qs + kM * kTileStride;                    // [kBufs][kTileRows][kTileStride]
  __nv_bfloat16* ps = rows + kBufs * kTileRows * kTileStride;     // [kM][kTilePStride]
  float* red = reinterpret_cast<float*>(ps + kM * kTilePStride);  // [kTileWarps][kM]
  float* lred = red + kTileWarps * kM;                            // [kTileWarps][kM]
  constexpr int64_t kvr = kTileLatent, dr = kTileRope;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tq = lane & 3;
  const int64_t tok0 = int64_t(blockIdx.x) * kTok, g0 = int64_t(blockIdx.y) * kGroup;
  const int g_count = static_cast<int>(min(static_cast<int64_t>(kGroup), nh - g0));
  const int64_t splits = gridDim.z, split = blockIdx.z;
  // The block's tokens (kTok == 2: splits == 1): those of one sequence share every tile; two of
  // different sequences (or a last token past n) are taken one run each.
  int64_t len[kTok], seq[kTok];
#pragma unroll
  for (int i = 0; i < kTok; ++i) {
    const bool valid = tok0 + i < n;
    len[i] = valid ? t.positions[tok0 + i] + 1 : 0;
    seq[i] = valid ? t.seq_index[tok0 + i] : -1;
  }
  const bool together = kTok == 1 || seq[kTok - 1] == seq[0];
  const int runs = together ? 1 : (seq[kTok - 1] >= 0 ? 2 : 1);
  const int64_t j_begin = split * span;
  int* counter = counters + tok0 * gridDim.y + blockIdx.y;  // kTok == 1 (splits > 1)
  // kBulk: a tile buffer's rows land by bulk copies counted on its mbarrier (bit b of `phase`:
  // the parity of buffer b's next phase).
#ifdef AFD_HAS_BULK
  __shared__ alignas(8) uint64_t bars[2];
  uint32_t phase = 0, filled = 0;  // filled: bit b once buffer b held a whole tile
  if constexpr (kBulk) {
    if (tid == 0) {
      MbarInit(&bars[0], 1);
      MbarInit(&bars[1], 1);
      MbarInitFence();
    }
    __syncthreads();
  }
#endif
  if constexpr (kTok == 1) {
    if (j_begin >= min(len[0], j_begin + span)) {  // an empty split (splits > 1)
      EmptySplitOutput(tok0, nh, g0, g_count, splits, split, partial, counter, o_lat,
                       reinterpret_cast<float*>(rows));
      return;
    }
  }
  // q rows of the group, [q_lat | q_pe] rounded to bf16 (zeros past the group's heads and past
  // n): every load of a token issued at once (one round trip); token 0's ahead of the first
  // tile's cache slot lookups.
  constexpr int kQVecs = kGroup * kTileChunks * 2, kQLoads = kQVecs / (kTileWarps * 32);
  static_assert(kQVecs % (kTileWarps * 32) == 0);
  const auto load_q = [&](int i, float4(&qv)[kQLoads]) {
    const int64_t tok = tok0 + i;
#pragma unroll
    for (int u = 0; u < kQLoads; ++u) {
      const int e = tid + u * kTileWarps * 32, h = e / (kTileChunks * 2),
                c4 = e % (kTileChunks * 2);
      qv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h < g_count && tok < n) {
        qv[u] = c4 < kvr / 4
                    ? reinterpret_cast<const float4*>(q_lat + (tok * nh + g0 + h) * kvr)[c4]
                    : reinterpret_cast<const float4*>(q + (tok * heads + h0 + g0 + h) * (dn + dr) +
                                                      dn)[c4 - kvr / 4];
      }
    }
  };
  const auto store_q = [&](int i, const float4(&qv)[kQLoads]) {
#pragma unroll
    for (int u = 0; u < kQLoads; ++u) {
      const int e = tid + u * kTileWarps * 32, h = e / (kTileChunks * 2),
                c4 = e % (kTileChunks * 2);
      __nv_bfloat162* dst =
          reinterpret_cast<__nv_bfloat162*>(qs + (kGroup * i + h) * kTileStride + 4 * c4);
      dst[0] = __floats2bfloat162_rn(qv[u].x, qv[u].y);
      dst[1] = __floats2bfloat162_rn(qv[u].z, qv[u].w);
    }
  };
  // ldmatrix row addresses: A operands (Q, P: 16 rows) and B operands (tile rows).
  const int a_row = lane & 15, a_col = 8 * (lane >> 4);
  const int b_row = lane & 7, b_col = 8 * (lane >> 3);
  const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1), v_col = 8 * (lane >> 4);
  // This thread's copy row of a tile.
  const int my_row = tid >> 2, my_piece = tid & 3;
  // The tile's rows into buffer buf (valid: its rows before the run's end; this thread's row
  // at `slot`, -1 past the end: not loaded). kBulk: one bulk copy a row (1152 bytes, by the row's
  // first thread), thread 0 expecting the valid rows' bytes on the buffer's mbarrier; else 16-byte
  // cp.async pieces, 4 threads a row.
  const auto load_tile = [&](int64_t slot, int buf, int64_t valid) {
    const __nv_bfloat16* src = cache + (slot < 0 ? 0 : slot) * kTileWidth;
    __nv_bfloat16* dst = rows + (buf * kTileRows + my_row) * kTileStride;
    if constexpr (kBulk) {
#ifdef AFD_HAS_BULK
      // Nothing to load: no arrival either, so that the buffer's phases stay one per tile used.
      if (valid <= 0) return;
      constexpr uint32_t kRowBytes = kTileWidth * sizeof(__nv_bfloat16);
      if (tid == 0) {
        MbarArriveExpect(
            &bars[buf],
            static_cast<uint32_t>(min(valid, static_cast<int64_t>(kTileRows))) * kRowBytes);
      }
      if (slot >= 0) {
        if (my_piece == 0) {
          FenceProxyAsyncShared();  // the block's reads of the buffer's last tile come first
          BulkCopyToShared(dst, src, kRowBytes, &bars[buf]);
        }
      } else if ((filled >> buf & 1u) == 0) {
        // Rows past the end only need finite values (their scores are masked, so P is 0 there):
        // a buffer that once held a whole tile keeps cache rows; zeros before that.
#pragma unroll
        for (int i = 0; i < kTileChunks / 4; ++i) {
          reinterpret_cast<uint4*>(dst)[my_piece + 4 * i] = make_uint4(0, 0, 0, 0);
        }
        FenceProxyAsyncShared();  // before a later bulk copy into the same row
      }
      if (valid >= kTileRows) filled |= 1u << buf;
#else
      __trap();  // launched only where the device's code is sm_90+ (LaunchMlaAttention)
#endif
    } else {
#pragma unroll
      for (int i = 0; i < kTileChunks / 4; ++i) {
        const int piece = my_piece + 4 * i;
        CopyAsync16Or0(dst + 8 * piece, src + 8 * piece, slot >= 0);
      }
      CopyAsyncCommit();
    }
  };
  for (int run = 0; run < runs; ++run) {
    // The run's tokens (active[i]) and each one's last position + 1 within the split (lim).
    bool active[kTok];
    int64_t lim[kTok], j_end = j_begin;
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
      active[i] = together ? len[i] > 0 : i == run;
      lim[i] = active[i] ? min(len[i], j_begin + span) : 0;
      j_end = max(j_end, lim[i]);
    }
    const int64_t rseq = seq[together ? 0 : run];
    const int32_t* table = t.block_tables + rseq * t.max_blocks;
    // The cache slot of this thread's copy row in the tile from j0 (-1 past the run's end).
    const auto slot_of = [&](int64_t j0) -> int64_t {
      const int64_t j = j0 + my_row;
      if (j >= j_end) return -1;
      return int64_t(table[j / t.block_size]) * t.block_size + j % t.block_size;
    };
    if (run == 0) {
      float4 qv[kQLoads];
      load_q(0, qv);
      load_tile(slot_of(j_begin), 0, j_end - j_begin);
      store_q(0, qv);
#pragma unroll
      for (int i = 1; i < kTok; ++i) {
        load_q(i, qv);
        store_q(i, qv);
      }
    } else {
      __syncthreads();  // the last run's tiles, P and sums are consumed
      load_tile(slot_of(j_begin), 0, j_end - j_begin);
    }
    int64_t next_slot = slot_of(j_begin + kTileRows);
    // Running max (log2 units) and this thread's partial sums, per token: heads gid, gid + 8.
    float m_lo[kTok], m_hi[kTok], l_lo[kTok], l_hi[kTok];
    float o[kTok][8][4];
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
      m_lo[i] = m_hi[i] = -FLT_MAX;
      l_lo[i] = l_hi[i] = 0.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c) o[i][c][0] = o[i][c][1] = o[i][c][2] = o[i][c][3] = 0.0f;
    }
    int buf = 0;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += kTileRows, buf ^= kBufs - 1) {
      if constexpr (kBulk) {
#ifdef AFD_HAS_BULK
        MbarWait(&bars[buf], phase >> buf & 1u);
        phase ^= 1u << buf;
#endif
      } else {
        CopyAsyncWait<0>();
      }
      __syncthreads();  // the tile is in; the other buffer, red and ps are free
      if (kBufs == 2 && j0 + kTileRows < j_end) {
        load_tile(next_slot, buf ^ 1, j_end - j0 - kTileRows);
        next_slot = slot_of(j0 + 2 * kTileRows);
      }
      const __nv_bfloat16* tile = rows + buf * kTileRows * kTileStride;
      // Scores of rows 8 warp + (2 tq, 2 tq + 1), token i's heads gid (s[i][0], s[i][1]) and
      // gid + 8 (s[i][2], s[i][3]).
      float s[kTok][4];
#pragma unroll
      for (int i = 0; i < kTok; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      {
        const __nv_bfloat16* qa = qs + a_row * kTileStride + a_col;
        const __nv_bfloat16* kb = tile + (8 * warp + b_row) * kTileStride + b_col;
#pragma unroll 6
        for (int kk = 0; kk < kTileWidth / 32; ++kk) {
          uint32_t b[4];
          Ldsm4(b, kb + 32 * kk);
#pragma unroll
          for (int i = 0; i < kTok; ++i) {
            uint32_t a0[4], a1[4];
            Ldsm4(a0, qa + kGroup * i * kTileStride + 32 * kk);
            Ldsm4(a1, qa + kGroup * i * kTileStride + 32 * kk + 16);
            MmaBf16(s[i], a0[0], a0[1], a0[2], a0[3], b[0], b[1]);
            MmaBf16(s[i], a1[0], a1[1], a1[2], a1[3], b[2], b[3]);
          }
        }
      }
      const int64_t j = j0 + 8 * warp + 2 * tq;
#pragma unroll
      for (int i = 0; i < kTok; ++i) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[i][c] = j + (c & 1) < lim[i] ? s[i][c] * scale_log2 : -INFINITY;
        }
        float mx_lo = fmaxf(s[i][0], s[i][1]), mx_hi = fmaxf(s[i][2], s[i][3]);
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
          mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
          mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
        }
        if (tq == 0) {
          red[warp * kM + kGroup * i + gid] = mx_lo;
          red[warp * kM + kGroup * i + gid + 8] = mx_hi;
        }
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kTok; ++i) {
        float new_lo = m_lo[i], new_hi = m_hi[i];
#pragma unroll
        for (int w = 0; w < kTileWarps; ++w) {
          new_lo = fmaxf(new_lo, red[w * kM + kGroup * i + gid]);
          new_hi = fmaxf(new_hi, red[w * kM + kGroup * i + gid + 8]);
        }
        const float alpha_lo = exp2f(m_lo[i] - new_lo), alpha_hi = exp2f(m_hi[i] - new_hi);
        m_lo[i] = new_lo;
        m_hi[i] = new_hi;
        const float p0 = exp2f(s[i][0] - new_lo), p1 = exp2f(s[i][1] - new_lo);
        const float p2 = exp2f(s[i][2] - new_hi), p3 = exp2f(s[i][3] - new_hi);
        l_lo[i] = l_lo[i] * alpha_lo + (p0 + p1);
        l_hi[i] = l_hi[i] * alpha_hi + (p2 + p3);
        *reinterpret_cast<__nv_bfloat162*>(ps + (kGroup * i + gid) * kTilePStride + 8 * warp +
                                           2 * tq) = __floats2bfloat162_rn(p0, p1);
        *reinterpret_cast<__nv_bfloat162*>(ps + (kGroup * i + gid + 8) * kTilePStride + 8 * warp +
                                           2 * tq) = __floats2bfloat162_rn(p2, p3);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          o[i][c][0] *= alpha_lo;
          o[i][c][1] *= alpha_lo;
          o[i][c][2] *= alpha_hi;
          o[i][c][3] *= alpha_hi;
        }
      }
      __syncthreads();  // P of every warp
#pragma unroll
      for (int ks = 0; ks < kTileRows / 16; ++ks) {
        uint32_t a[kTok][4];
#pragma unroll
        for (int i = 0; i < kTok; ++i) {
          Ldsm4(a[i], ps + (kGroup * i + a_row) * kTilePStride + 16 * ks + a_col);
        }
        const __nv_bfloat16* vb = tile + (16 * ks + v_row) * kTileStride + 64 * warp + v_col;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          Ldsm4T(b, vb + 16 * np);
#pragma unroll
          for (int i = 0; i < kTok; ++i) {
            MmaBf16(o[i][2 * np], a[i][0], a[i][1], a[i][2], a[i][3], b[0], b[1]);
            MmaBf16(o[i][2 * np + 1], a[i][0], a[i][1], a[i][2], a[i][3], b[2], b[3]);
          }
        }
      }
      if (kBufs == 1 && j0 + kTileRows < j_end) {
        __syncthreads();  // every warp is past the tile
        load_tile(next_slot, 0, j_end - j0 - kTileRows);
        next_slot = slot_of(j0 + 2 * kTileRows);
      }
    }
    // l over the block: the 4 lanes of a row, then the warps in order.
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        l_lo[i] += __shfl_xor_sync(0xffffffffu, l_lo[i], off);
        l_hi[i] += __shfl_xor_sync(0xffffffffu, l_hi[i], off);
      }
      if (tq == 0) {
        lred[warp * kM + kGroup * i + gid] = l_lo[i];
        lred[warp * kM + kGroup * i + gid + 8] = l_hi[i];
      }
    }
    __syncthreads();
    // One split: o_lat = o / l at once (what AttentionCombine makes of one split); several
    // (one token a block): the partial, then maybe the merge.
#pragma unroll
    for (int i = 0; i < kTok; ++i) {
      if (!active[i]) continue;
      float total_lo = 0.0f, total_hi = 0.0f;
      for (int w = 0; w < kTileWarps; ++w) {
        total_lo += lred[w * kM + kGroup * i + gid];
        total_hi += lred[w * kM + kGroup * i + gid + 8];
      }
      TileOutput<kTok == 1>(o[i], m_lo[i], m_hi[i], total_lo, total_hi, tok0 + i, nh, g0, g_count,
                            splits, split, partial, counter, o_lat, reinterpret_cast<float*>(rows));
    }
  }
}

// Absorbed MLA decode with the scores on wgmma (sm_90a; one query token a block, DeepSeek's
// 512 + 64 with a bf16 cache whose block size is a multiple of 64, so that a 64-row tile is
// one run of cache slots). A tile lands by TMA as 9 boxes of 64 rows x 64 dims in the 128-byte
// swizzle (a tensor map over the layer's cache), Q (16 heads) is staged in the same layout, and
// each warpgroup computes Sᵀ [64 rows x 16 heads] = tile · Qᵀ with 36 wgmma m64n16k16 issued at
// once (the tensor cores pipeline them; AttentionTiles' 36 dependent mma.sync per warp were the
// chain that one block per SM could not hide). Both warpgroups compute the same Sᵀ (so the
// softmax needs no exchange between them); warpgroup 0 publishes the per-warp maxima, P and the
// sums. P·V stays on mma.sync as in AttentionTiles, its ldmatrix rows read through the swizzle.
// Rows past the end (the last tile's, read from the cache page) are zeroed after the scores so
// that P·V adds exact zeros whatever the page holds there. Partials and the merge as
// AttentionTiles.
constexpr int kWgBoxBytes = kTileRows * 128;          // 64 rows x 64 dims (bf16)
constexpr int kWgBoxes = kTileWidth / 64;             // 9
constexpr int kWgTileBytes = kWgBoxes * kWgBoxBytes;  // 73,728
constexpr int kWgQBoxBytes = kGroup * 128;            // 16 heads x 64 dims
constexpr size_t WgSmemBytes(int bufs) {
  return 1024 + size_t(bufs) * kWgTileBytes + kWgBoxes * kWgQBoxBytes +
         size_t(kGroup) * kTilePStride * 2 + 2 * 4 * kGroup * sizeof(float);
}

template <int kBufs>
__global__ void __launch_bounds__(kTileWarps * 32, kBufs == 1 ? 2 : 1)
    AttentionWg(const __grid_constant__ CUtensorMap tmap, const float* q, int64_t n, int64_t heads,
                const float* q_lat, int64_t dn, PagedArgs t, int64_t h0, int64_t nh,
                float scale_log2, int64_t span, float* partial, int* counters, float* o_lat) {
#ifdef AFD_HAS_WGMMA
  PdlStart();
  extern __shared__ float4 wg_smem4[];
  auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(wg_smem4) + 1023) &
                                          ~static_cast<uintptr_t>(1023));
  uint8_t* tiles = base;                       // [kBufs][9 boxes], swizzled
  uint8_t* qs = tiles + kBufs * kWgTileBytes;  // [9 boxes of 16 rows], swizzled
  auto* ps = reinterpret_cast<__nv_bfloat16*>(qs + kWgBoxes * kWgQBoxBytes);  // [16][PStride]
  float* red = reinterpret_cast<float*>(ps + kGroup * kTilePStride);          // [4 warps][16 heads]
  float* lred = red + 4 * kGroup;                                             // [4 warps][16 heads]
  __shared__ alignas(8) uint64_t bars[2];
  constexpr int64_t kvr = kTileLatent, dr = kTileRope;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tq = lane & 3;
  const int w4 = warp & 3;
  const bool wg0 = warp < 4;
  const int64_t tok0 = blockIdx.x, g0 = int64_t(blockIdx.y) * kGroup;
  const int g_count = static_cast<int>(min(static_cast<int64_t>(kGroup), nh - g0));
  const int64_t splits = gridDim.z, split = blockIdx.z;
  const int64_t len = t.positions[tok0] + 1, seq = t.seq_index[tok0];
  const int64_t j_begin = split * span, j_end = min(len, j_begin + span);
  int* counter = counters + tok0 * gridDim.y + blockIdx.y;
  if (tid == 0) {
    MbarInit(&bars[0], 1);
    MbarInit(&bars[1], 1);
    MbarInitFence();
  }
  __syncthreads();
  if (j_begin >= j_end) {  // an empty split (splits > 1)
    EmptySplitOutput(tok0, nh, g0, g_count, splits, split, partial, counter, o_lat,
                     reinterpret_cast<float*>(tiles));
    return;
  }
  const int32_t* table = t.block_tables + seq * t.max_blocks;
  // The first cache row of the tile from j0 (its 64 rows are consecutive slots).
  const auto tile_row = [&](int64_t j0) -> int64_t {
    return int64_t(table[j0 / t.block_size]) * t.block_size + j0 % t.block_size;
  };
  const auto load_tile = [&](int64_t row0, int buf) {  // thread 0
    FenceProxyAsyncShared();  // the block's reads of the buffer's last tile come first
    MbarArriveExpect(&bars[buf], kWgTileBytes);
#pragma unroll
    for (int b = 0; b < kWgBoxes; ++b) {
      TmaLoad2d(tiles + buf * kWgTileBytes + b * kWgBoxBytes, &tmap, 64 * b, static_cast<int>(row0),
                &bars[buf]);
    }
  };
  if (tid == 0) load_tile(tile_row(j_begin), 0);
  // Q [16 heads][576] as bf16 into the swizzled boxes (zeros past the group's heads): 16-byte
  // chunk c of head h's 128-byte row in box b at c ^ (h % 8).
  {
    constexpr int kQVecs = kGroup * kTileWidth / 4, kQLoads = kQVecs / (kTileWarps * 32);
    static_assert(kQVecs % (kTileWarps * 32) == 0);
    float4 qv[kQLoads];
#pragma unroll
    for (int u = 0; u < kQLoads; ++u) {
      const int e = tid + u * kTileWarps * 32, h = e / (kTileWidth / 4), c4 = e % (kTileWidth / 4);
      qv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h < g_count) {
        qv[u] = c4 < kvr / 4
                    ? reinterpret_cast<const float4*>(q_lat + (tok0 * nh + g0 + h) * kvr)[c4]
                    : reinterpret_cast<const float4*>(q + (tok0 * heads + h0 + g0 + h) * (dn + dr) +
                                                      dn)[c4 - kvr / 4];
      }
    }
#pragma unroll
    for (int u = 0; u < kQLoads; ++u) {
      const int e = tid + u * kTileWarps * 32, h = e / (kTileWidth / 4), c4 = e % (kTileWidth / 4);
      const int d = 4 * c4, box = d / 64, chunk = (d % 64) / 8;
      auto* dst = reinterpret_cast<__nv_bfloat162*>(qs + box * kWgQBoxBytes + h * 128 +
                                                    ((chunk ^ (h & 7)) * 16) + (d % 8) * 2);
      dst[0] = __floats2bfloat162_rn(qv[u].x, qv[u].y);
      dst[1] = __floats2bfloat162_rn(qv[u].z, qv[u].w);
    }
    FenceProxyAsyncShared();  // Q's generic writes before wgmma reads it (after the barrier)
  }
  int64_t next_row = j_begin + kTileRows < j_end ? tile_row(j_begin + kTileRows) : 0;
  // This thread's heads of Sᵀ: k = 0..3 -> 2 tq, 2 tq + 1, 8 + 2 tq, 9 + 2 tq; its rows
  // r0 = 16 w4 + gid, r0 + 8. Of O (P·V, as AttentionTiles): heads gid, gid + 8.
  int hs[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) hs[k] = (k < 2 ? 0 : 8) + 2 * tq + (k & 1);
  const int r0 = 16 * w4 + gid;
  float m_s[4], l_s[4], m_lo = -FLT_MAX, m_hi = -FLT_MAX;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    m_s[k] = -FLT_MAX;
    l_s[k] = 0.0f;
  }
  float o[8][4];
#pragma unroll
  for (int c = 0; c < 8; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.0f;
  const int a_row = lane & 15, a_col = 8 * (lane >> 4);
  const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1), v_hi = lane >> 4;
  int buf = 0;
  uint32_t phase = 0;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kTileRows, buf ^= kBufs - 1) {
    MbarWait(&bars[buf], phase >> buf & 1u);
    phase ^= 1u << buf;
    __syncthreads();  // Q staged (first tile); the last tile's P·V, red and ps are done
    if (kBufs == 2 && j0 + kTileRows < j_end) {
      if (tid == 0) load_tile(next_row, buf ^ 1);
      next_row = j0 + 2 * kTileRows < j_end ? tile_row(j0 + 2 * kTileRows) : 0;
    }
    uint8_t* tile = tiles + buf * kWgTileBytes;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    WgmmaFence();
#pragma unroll
    for (int b = 0; b < kWgBoxes; ++b) {
      const uint64_t a_desc = Sw128Desc(tile + b * kWgBoxBytes);
      const uint64_t b_desc = Sw128Desc(qs + b * kWgQBoxBytes);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) Wgmma64x16Bf16(acc, a_desc + 2 * ks, b_desc + 2 * ks, b | ks);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    // acc[4j + x]: row r0 (x < 2) or r0 + 8, head 8j + 2 tq + (x & 1); as s[k][row 0 / 1].
    float s[4][2];
    const bool ok0 = j0 + r0 < j_end, ok1 = j0 + r0 + 8 < j_end;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int base4 = 4 * (k >> 1) + (k & 1);
      s[k][0] = ok0 ? acc[base4] * scale_log2 : -INFINITY;
      s[k][1] = ok1 ? acc[base4 + 2] * scale_log2 : -INFINITY;
      float mx = fmaxf(s[k][0], s[k][1]);
#pragma unroll
      for (int off = 4; off <= 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      if (wg0 && gid == 0) red[w4 * kGroup + hs[k]] = mx;
    }
    __syncthreads();  // maxima; both warpgroups' wgmma reads of the tile are done
    // Rows past the end: zeros for P·V (the scores are already masked).
    if (j0 + kTileRows > j_end) {
      const int valid = static_cast<int>(j_end - j0);
      for (int i = tid; i < (kTileRows - valid) * kWgBoxes * 8; i += kTileWarps * 32) {
        const int r = valid + i / (kWgBoxes * 8), rest = i % (kWgBoxes * 8);
        reinterpret_cast<uint4*>(tile + (rest / 8) * kWgBoxBytes + r * 128)[rest % 8] =
            make_uint4(0, 0, 0, 0);
      }
      FenceProxyAsyncShared();  // before a later TMA write of the buffer
    }
    const auto max_of = [&](int h, float m_old) {
      float m = m_old;
#pragma unroll
      for (int w = 0; w < 4; ++w) m = fmaxf(m, red[w * kGroup + h]);
      return m;
    };
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float m_new = max_of(hs[k], m_s[k]);
      const float alpha = exp2f(m_s[k] - m_new);
      m_s[k] = m_new;
      const float p0 = exp2f(s[k][0] - m_new), p1 = exp2f(s[k][1] - m_new);
      l_s[k] = l_s[k] * alpha + (p0 + p1);
      if (wg0) {
        ps[hs[k] * kTilePStride + r0] = __float2bfloat16_rn(p0);
        ps[hs[k] * kTilePStride + r0 + 8] = __float2bfloat16_rn(p1);
      }
    }
    {
      const float new_lo = max_of(gid, m_lo), new_hi = max_of(gid + 8, m_hi);
      const float alpha_lo = exp2f(m_lo - new_lo), alpha_hi = exp2f(m_hi - new_hi);
      m_lo = new_lo;
      m_hi = new_hi;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        o[c][0] *= alpha_lo;
        o[c][1] *= alpha_lo;
        o[c][2] *= alpha_hi;
        o[c][3] *= alpha_hi;
      }
    }
    __syncthreads();  // P of warpgroup 0; the zeroed rows
    // O [16 x 512] += P · tile[:, :512]: warp w owns columns 64 w .. (box w); ldmatrix row R's
    // chunk c at c ^ (R % 8).
#pragma unroll
    for (int ks = 0; ks < kTileRows / 16; ++ks) {
      uint32_t a[4];
      Ldsm4(a, ps + a_row * kTilePStride + 16 * ks + a_col);
      const int row = 16 * ks + v_row;
      const uint8_t* vrow = tile + warp * kWgBoxBytes + row * 128;
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        Ldsm4T(b, vrow + (((2 * np + v_hi) ^ (row & 7)) * 16));
        MmaBf16(o[2 * np], a[0], a[1], a[2], a[3], b[0], b[1]);
        MmaBf16(o[2 * np + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
    if (kBufs == 1 && j0 + kTileRows < j_end) {
      __syncthreads();  // every warp is past the tile
      if (tid == 0) load_tile(next_row, 0);
      next_row = j0 + 2 * kTileRows < j_end ? tile_row(j0 + 2 * kTileRows) : 0;
    }
  }
  // l over the block: warpgroup 0's rows, the 8 gid lanes, then its warps in order.
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float l = l_s[k];
#pragma unroll
    for (int off = 4; off <= 16; off <<= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (wg0 && gid == 0) lred[w4 * kGroup + hs[k]] = l;
  }
  __syncthreads();
  const auto total_of = [&](int h) {
    float total = 0.0f;
    for (int w = 0; w < 4; ++w) total += lred[w * kGroup + h];
    return total;
  };
  TileOutput<true>(o, m_lo, m_hi, total_of(gid), total_of(gid + 8), tok0, nh, g0, g_count, splits,
                   split, partial, counter, o_lat, reinterpret_cast<float*>(tiles));
#else
  __trap();      // launched only where the device runs sm_90a code (LaunchMlaAttention)
#endif
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

}  // namespace

void LaunchRope(float* x, int64_t n, int64_t heads, int64_t width, int64_t offset,
                const int64_t* positions, const RopeArgs& rope, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(Rope, static_cast<unsigned>(n), 256, 0, s, x, heads, width, offset, positions, rope);
  CheckLaunch("Rope");
}

void LaunchMlaCacheWrite(const float* ckv, int64_t n, int64_t kvr, const float* norm_w, float eps,
                         const PagedArgs& t, const RopeArgs& rope, void* cache, bool bf16_cache,
                         cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(rope.dim <= kMaxRopeDim, "MlaCacheWrite: rope dim {} above {}", rope.dim, kMaxRopeDim);
  if (bf16_cache) {
    LaunchPdl(CacheWrite<__nv_bfloat16>, static_cast<unsigned>(n), 256, 0, s, ckv, kvr, norm_w, eps,
              t, rope, static_cast<__nv_bfloat16*>(cache));
  } else {
    LaunchPdl(CacheWrite<float>, static_cast<unsigned>(n), 256, 0, s, ckv, kvr, norm_w, eps, t,
              rope, static_cast<float*>(cache));
  }
  CheckLaunch("MlaCacheWrite");
}

bool MlaTilesFit(int64_t kvr, int64_t dr, bool bf16_cache, bool tf32) {
  static const bool disabled = ChoiceOff("AFD_MLA_TILES");  // the chunked kernel
  return !disabled && bf16_cache && tf32 && kvr == kTileLatent && dr == kTileRope;
}

int64_t MlaSplits(int64_t n, int64_t nh, int64_t max_context, bool tiles, int sm_count) {
  const int64_t blocks = std::max<int64_t>(n * ((nh + kGroup - 1) / kGroup), 1);
  // AFD_MLA_SPLITS=s: s splits (at most one per tile or chunk, at most 64), to measure the
  // choice below against others (backend_ops_test --perf --op MlaAttention).
  static const int64_t forced = ChoiceCount("AFD_MLA_SPLITS", kMaxMlaSplits);
  if (forced > 0) {
    const int64_t rows = tiles ? kTileRows : kRows;
    return std::min<int64_t>({forced, (max_context + rows - 1) / rows, kMaxMlaSplits});
  }
  if (tiles) {
    // One block per SM (the double-buffered form, which runs while the grid is at most one block
    // per SM): the split count s that minimises waves(s) x (tiles per split + 1) (the
    // 1 for a block's start: q rows, the first tile's latency) + the merge of s > 1 splits,
    // 2 + s / 4 tiles' time (the MlaAttention op on the H200, one token, W_k and W_v included:
    // 3 tiles take 30 us in one split, 34 in three; 8 tiles 47 / 37 / 38 us in 1 / 4 / 8 splits; 16
    // tiles 41 us in 8, 46 in 16); ties to fewer splits. In quarter tiles:
    const int64_t tiles_total = (max_context + kTileRows - 1) / kTileRows;
    const int64_t sms = std::max(sm_count, 1);
    int64_t best = 1, best_cost = INT64_MAX;
    for (int64_t s = 1; s <= std::min<int64_t>(tiles_total, kMaxMlaSplits); ++s) {
      const int64_t span = (tiles_total + s - 1) / s, used = (tiles_total + span - 1) / span;
      if (used != s) continue;  // the same spans as a smaller count
      const int64_t cost = 4 * ((blocks * s + sms - 1) / sms) * (span + 1) + (s > 1 ? 8 + s : 0);
      if (cost < best_cost) best = s, best_cost = cost;
    }
    return best;
  }
  // Enough blocks to fill the GPU (~2 per SM) when few tokens attend long contexts; each split at
  // least one chunk of positions (the next chunk's loads overlap the current one).
  const int64_t want = (2 * int64_t(std::max(sm_count, 1)) + blocks - 1) / blocks;
  const int64_t chunks = (max_context + kRows - 1) / kRows;
  return std::max<int64_t>(1, std::min<int64_t>({want, chunks, 64}));
}

namespace {

// The W_k / W_v products of absorbed MLA for a few tokens (decode at small batch). cuBLAS's
// batched SGEMMs take tens of microseconds at n = 1 for ~4 MB of weights per layer; these read
// each head's weights once per chunk of kMlaTok tokens, fp32 throughout, every sum in a fixed
// order (no atomics): the same result whatever the batch around a token.
constexpr int kMlaTok = 8;      // tokens per block (chunk)
constexpr int kQLatGroups = 4;  // d-groups per column in MlaQLat (threads = 32 x groups)
constexpr int kMlaLoads = 16;   // MlaQLat's weight loads in flight per thread

// q_lat[t, hh, c] = sum_d q[t, h0 + hh, d] * W_k[h0 + hh][d, c]; W_k[h] = kv_b + h (dn + dv) kvr,
// rows of kvr. Grid (ceil(kvr / 32), nh, ceil(n / kMlaTok)); thread (lane, g) sums d = g, g + 4,
// ... for column 32 blockIdx.x + lane, then group 0 adds the groups in order.
__global__ void __launch_bounds__(32 * kQLatGroups)
    MlaQLat(const float* q, int64_t n, int64_t heads, int64_t dn, int64_t dr, int64_t dv,
            const float* kv_b, int64_t h0, int64_t nh, int64_t kvr, float* q_lat) {
  extern __shared__ float smem[];  // q_nope [kMlaTok][dn], then partial [groups][kMlaTok][32]
  float* qs = smem;
  float* part = smem + kMlaTok * dn;
  const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int64_t hh = blockIdx.y, h = h0 + hh, t0 = int64_t(blockIdx.z) * kMlaTok;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  const bool active = c < kvr;
  const float* w = kv_b + h * (dn + dv) * kvr + (active ? c : 0);
  // kMlaLoads weights in flight per thread (d = g, g + groups, ...), the first batch before the
  // wait for the kernel before (nothing writes the weights).
  float wv[kMlaLoads];
  const auto load = [&](int64_t d0) {
#pragma unroll
    for (int u = 0; u < kMlaLoads; ++u) {
      const int64_t d = d0 + u * kQLatGroups;
      wv[u] = active && d < dn ? w[d * kvr] : 0.0f;
    }
  };
  load(g);
  PdlStart();
  const int cnt = static_cast<int>(n - t0 < kMlaTok ? n - t0 : kMlaTok);
  for (int64_t i = threadIdx.x; i < cnt * dn; i += blockDim.x) {
    const int64_t t = i / dn, d = i % dn;
    qs[i] = q[((t0 + t) * heads + h) * (dn + dr) + d];
  }
  __syncthreads();
  float acc[kMlaTok] = {};
  for (int64_t d0 = g;;) {
#pragma unroll
    for (int u = 0; u < kMlaLoads; ++u) {
      const int64_t d = d0 + u * kQLatGroups;
      if (d >= dn) break;
#pragma unroll
      for (int t = 0; t < kMlaTok; ++t) acc[t] += qs[t * dn + d] * wv[u];
    }
    d0 += kMlaLoads * kQLatGroups;
    if (d0 >= dn) break;
    load(d0);
  }
#pragma unroll
  for (int t = 0; t < kMlaTok; ++t) part[(g * kMlaTok + t) * 32 + lane] = acc[t];
  __syncthreads();
  if (g != 0 || !active) return;
  for (int t = 0; t < cnt; ++t) {
    float v = part[t * 32 + lane];
    for (int gg = 1; gg < kQLatGroups; ++gg) v += part[(gg * kMlaTok + t) * 32 + lane];
    q_lat[((t0 + t) * nh + hh) * kvr + c] = v;
  }
}

// out[t, hh dv + j] = sum_c o_lat[t, hh, c] * W_v[h0 + hh][j, c]; W_v[h] = W_k[h] + dn kvr, rows
// of kvr. Grid (ceil(dv / 8), nh, ceil(n / kMlaTok)), 8 warps: warp w computes output j = 8
// blockIdx.x + w, its lanes striding over c with 16-byte loads, then a fixed shuffle tree.
__global__ void __launch_bounds__(256)
    MlaOut(const float* o_lat, int64_t n, int64_t dn, int64_t dv, const float* kv_b, int64_t h0,
           int64_t nh, int64_t kvr, float* out) {
  extern __shared__ float smem[];  // o_lat of this head [kMlaTok][kvr]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t hh = blockIdx.y, h = h0 + hh, t0 = int64_t(blockIdx.z) * kMlaTok;
  const int64_t j = int64_t(blockIdx.x) * 8 + warp;
  const bool active = j < dv;
  const float* w = kv_b + (h * (dn + dv) + dn + (active ? j : 0)) * kvr;
  // The row's first kOutLoads 16-byte pieces per lane in flight before the wait (all of a
  // 512-wide row).
  constexpr int kOutLoads = 4;
  float4 wv[kOutLoads];
  const auto load = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kOutLoads; ++u) {
      const int64_t c = c0 + u * 32 * 4;
      if (active && c < kvr) wv[u] = *reinterpret_cast<const float4*>(w + c);
    }
  };
  load(int64_t(lane) * 4);
  PdlStart();
  const int cnt = static_cast<int>(n - t0 < kMlaTok ? n - t0 : kMlaTok);
  for (int64_t i = threadIdx.x; i < cnt * kvr; i += blockDim.x) {
    const int64_t t = i / kvr, c = i % kvr;
    smem[i] = o_lat[((t0 + t) * nh + hh) * kvr + c];
  }
  __syncthreads();
  if (!active) return;
  float acc[kMlaTok] = {};
  for (int64_t c0 = int64_t(lane) * 4;;) {
#pragma unroll
    for (int u = 0; u < kOutLoads; ++u) {
      const int64_t c = c0 + u * 32 * 4;
      if (c >= kvr) break;
#pragma unroll
      for (int t = 0; t < kMlaTok; ++t) {
        if (t >= cnt) break;
        const float4 ov = *reinterpret_cast<const float4*>(smem + t * kvr + c);
        acc[t] += wv[u].x * ov.x + wv[u].y * ov.y + wv[u].z * ov.z + wv[u].w * ov.w;
      }
    }
    c0 += kOutLoads * 32 * 4;
    if (c0 >= kvr) break;
    load(c0);
  }
#pragma unroll
  for (int t = 0; t < kMlaTok; ++t) {
    if (t >= cnt) break;
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[(t0 + t) * nh * dv + hh * dv + j] = v;
  }
}

}  // namespace

bool MlaProjectionsFit(int64_t n, int64_t dn, int64_t kvr) {
  return n >= 1 && n <= kMlaSmallBatch && kvr % 4 == 0 &&
         (kMlaTok * dn + kQLatGroups * kMlaTok * 32) * sizeof(float) <= 48 * 1024 &&
         kMlaTok * kvr * sizeof(float) <= 48 * 1024;
}

void LaunchMlaQLat(const float* q, int64_t n, int64_t heads, int64_t dn, int64_t dr, int64_t dv,
                   const float* kv_b, int64_t h0, int64_t h1, int64_t kvr, float* q_lat,
                   cudaStream_t s) {
  AFD_CHECK(MlaProjectionsFit(n, dn, kvr), "MlaQLat: {} tokens, dn {}, kvr {}", n, dn, kvr);
  const int64_t nh = h1 - h0;
  const dim3 grid(static_cast<unsigned>((kvr + 31) / 32), static_cast<unsigned>(nh),
                  static_cast<unsigned>((n + kMlaTok - 1) / kMlaTok));
  const size_t smem = (kMlaTok * dn + kQLatGroups * kMlaTok * 32) * sizeof(float);
  LaunchPdl(MlaQLat, grid, 32 * kQLatGroups, smem, s, q, n, heads, dn, dr, dv, kv_b, h0, nh, kvr,
            q_lat);
  CheckLaunch("MlaAttention (W_k)");
}

void LaunchMlaOut(const float* o_lat, int64_t n, int64_t dn, int64_t dv, const float* kv_b,
                  int64_t h0, int64_t h1, int64_t kvr, float* out, cudaStream_t s) {
  AFD_CHECK(MlaProjectionsFit(n, dn, kvr), "MlaOut: {} tokens, dn {}, kvr {}", n, dn, kvr);
  const int64_t nh = h1 - h0;
  const dim3 grid(static_cast<unsigned>((dv + 7) / 8), static_cast<unsigned>(nh),
                  static_cast<unsigned>((n + kMlaTok - 1) / kMlaTok));
  LaunchPdl(MlaOut, grid, 256, kMlaTok * kvr * sizeof(float), s, o_lat, n, dn, dv, kv_b, h0, nh,
            kvr, out);
  CheckLaunch("MlaAttention (W_v)");
}

int64_t MlaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t kvr) {
  return n * nh * splits * (kvr + 2);
}

int64_t MlaCounters(int64_t n, int64_t nh) { return n * ((nh + kGroup - 1) / kGroup); }

namespace {

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

// The tensor map AttentionWg loads a layer's bf16 cache [rows, 576] by: boxes of 64 rows x 64
// dims in the 128-byte swizzle. Encoded per launch (host only, ~1 us; a graph keeps the value).
CUtensorMap CacheTensorMap(const void* cache, int64_t rows) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    AFD_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                    cudaEnableDefault, &found));
    AFD_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
              "MlaAttention on cuda: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<Encode>(fn);
  }();
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kTileWidth), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {kTileWidth * sizeof(__nv_bfloat16)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kTileRows)}, steps[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(cache), dims, strides,
             box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  AFD_CHECK(r == CUDA_SUCCESS, "MlaAttention on cuda: tensor map of the cache ({} rows): error {}",
            rows, static_cast<int>(r));
  return map;
}

}  // namespace

void LaunchMlaAttention(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t kvr,
                        int64_t dn, int64_t dr, const PagedArgs& t, const void* cache,
                        int64_t cache_rows, bool bf16_cache, int64_t h0, int64_t h1, float scale,
                        int64_t max_context, int64_t splits, bool tf32, float* partial,
                        int* counters, float* o_lat, int sm_count, cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(kvr <= kMaxLatent && kvr % 4 == 0 && dr % 4 == 0 && dn % 4 == 0 &&
                kvr + dr <= kMaxWidth && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(cache) % 16 == 0,
            "MlaAttention on cuda: kv_lora_rank {} (at most {}), rope dim {} and nope dim {} must "
            "be multiples of 4 (latent + rope at most {}), q and the cache 16-byte aligned",
            kvr, kMaxLatent, dr, dn, kMaxWidth);
  const int64_t nh = h1 - h0;
  if (MlaTilesFit(kvr, dr, bf16_cache, tf32)) {
    AFD_CHECK(splits >= 1 && splits <= kMaxMlaSplits, "MlaAttention (tiles): {} splits", splits);
    const int64_t tiles = (max_context + kTileRows - 1) / kTileRows;
    const int64_t span = (tiles + splits - 1) / splits * kTileRows;
    constexpr float kLog2e = 1.4426950408889634f;
    // Tile rows by bulk copies (the TMA engine) where the device runs sm_90+ code, else
    // 16-byte cp.async pieces.
    const bool bulk = ProbeRunningCode().arch >= 900;
    const auto go = [&](auto tokens, auto bufs) {
      constexpr int kTok = decltype(tokens)::value, kBufs = decltype(bufs)::value;
      const auto kernel =
          bulk ? AttentionTiles<kTok, kBufs, true> : AttentionTiles<kTok, kBufs, false>;
      static const bool raised = [&] {
        for (const auto k :
             {AttentionTiles<kTok, kBufs, true>, AttentionTiles<kTok, kBufs, false>}) {
          AFD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(TileSmemBytes(kTok, kBufs))));
        }
        return true;
      }();
      (void)raised;
      const dim3 grid(static_cast<unsigned>((n + kTok - 1) / kTok),
                      static_cast<unsigned>((nh + kGroup - 1) / kGroup),
                      static_cast<unsigned>(splits));
      LaunchPdl(kernel, grid, kTileWarps * 32, TileSmemBytes(kTok, kBufs), s, q, n, heads, q_lat,
                dn, t, static_cast<const __nv_bfloat16*>(cache), h0, nh, scale * kLog2e, span,
                partial, counters, o_lat);
    };
    // One tile buffer and two blocks per SM once the grid is more than one block per SM: a
    // block's next tile then loads while the other block computes (AFD_MLA_BUFS=1|2 forces a
    // form).
    static const int64_t forced_bufs = ChoiceCount("AFD_MLA_BUFS", 2);
    const int64_t blocks = n * ((nh + kGroup - 1) / kGroup) * splits;
    const bool one_buf =
        forced_bufs > 0 ? forced_bufs == 1 : blocks > int64_t(std::max(sm_count, 1));
    // AttentionWg (sm_90a code; tiles of whole runs of cache slots: block size a multiple of 64;
    // one token a block) where each block walks at least kWgMinTiles tiles; AFD_MLA_WG=1 wherever
    // it can run, AFD_MLA_WG=0 never. Seventeenth session, one H200 (docs/perf.md): at 9 and 17
    // tiles a block faster (MlaAttention op 64 x 1024 0.067 vs 0.070 ms, 256 x 1024 0.122 vs
    // 0.127; decode at context 1024 batch 64 11.24 vs 11.60 ms), at 2-3 tiles slower (decode at
    // context 128 batch 1 / 16 / 64: 2.580 / 8.001 / 10.128 vs 2.524 / 7.967 / 10.092 ms).
    constexpr int64_t kWgMinTiles = 8;
    static const bool wg_off = ChoiceOff("AFD_MLA_WG");
    static const bool wg_always = !wg_off && ChoiceCount("AFD_MLA_WG", 1) == 1;
    const bool wg_on = !wg_off && (wg_always || span / kTileRows >= kWgMinTiles);
    const bool pairs = splits == 1 && n >= kTilePairMinTokens;
    if (!pairs && wg_on && ProbeRunningCode().sm90a && t.block_size % kTileRows == 0) {
      const CUtensorMap map = CacheTensorMap(cache, cache_rows);
      const auto go_wg = [&](auto bufs) {
        constexpr int kBufs = decltype(bufs)::value;
        static const bool raised = [&] {
          AFD_CUDA_CHECK(cudaFuncSetAttribute(AttentionWg<kBufs>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(WgSmemBytes(kBufs))));
          return true;
        }();
        (void)raised;
        const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((nh + kGroup - 1) / kGroup),
                        static_cast<unsigned>(splits));
        LaunchPdl(AttentionWg<kBufs>, grid, kTileWarps * 32, WgSmemBytes(kBufs), s, map, q, n,
                  heads, q_lat, dn, t, h0, nh, scale * kLog2e, span, partial, counters, o_lat);
      };
      if (one_buf) {
        go_wg(std::integral_constant<int, 1>{});
      } else {
        go_wg(std::integral_constant<int, 2>{});
      }
      CheckLaunch("MlaAttention (wgmma)");
      return;
    }
    if (pairs) {
      go(std::integral_constant<int, 2>{}, std::integral_constant<int, 2>{});
    } else if (one_buf) {
      go(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{});
    } else {
      go(std::integral_constant<int, 1>{}, std::integral_constant<int, 2>{});
    }
    CheckLaunch("MlaAttention (tiles)");
    return;  // the kernel writes o_lat itself (one split) or merges the splits (the last block)
  }
  LaunchChunks(q, n, heads, q_lat, kvr, dn, dr, t, cache, bf16_cache, h0, h1, scale, max_context,
               splits, tf32, partial, s);
  const dim3 grid2(static_cast<unsigned>(n), static_cast<unsigned>(nh));
  LaunchPdl(AttentionCombine, grid2, kAttnThreads, 0, s, kvr, nh, splits, partial, o_lat);
  CheckLaunch("MlaAttention (combine)");
}

}  // namespace afd::kernels::cuda

// Absorbed MLA decode with the scores on wgmma (AttentionWg, sm_90a): TMA boxes of the cache
// through a tensor map; mla_decode.cuh.
#include <cuda.h>  // CUtensorMap (encoded through the runtime's driver entry point)
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/common/cuda_driver.h"
#include "afd/kernels/cuda/elementwise.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/mla_decode.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/pdl.cuh"
#include "afd/kernels/cuda/rope.cuh"

namespace afd::kernels::cuda {

namespace {

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
  __trap();  // launched only where the device runs sm_90a code (LaunchMlaAttention)
#endif
}

// The tensor map AttentionWg loads a layer's bf16 cache [rows, 576] by: boxes of 64 rows x 64
// dims in the 128-byte swizzle. Encoded per launch (host only, ~1 us; a graph keeps the value).
CUtensorMap CacheTensorMap(const void* cache, int64_t rows) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = reinterpret_cast<Encode>(
      RequireCudaDriverFunction("cuTensorMapEncodeTiled", "MlaAttention on cuda"));
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

void LaunchMlaWg(int bufs, const void* cache, int64_t cache_rows, int64_t splits,
                 const MlaTileArgs& a, cudaStream_t s) {
  const CUtensorMap map = CacheTensorMap(cache, cache_rows);
  const auto go_wg = [&](auto buffers) {
    constexpr int kBufs = decltype(buffers)::value;
    static const bool raised = [&] {
      AFD_CUDA_CHECK(cudaFuncSetAttribute(AttentionWg<kBufs>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(WgSmemBytes(kBufs))));
      return true;
    }();
    (void)raised;
    const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>((a.nh + kGroup - 1) / kGroup),
                    static_cast<unsigned>(splits));
    LaunchPdl(AttentionWg<kBufs>, grid, kTileWarps * 32, WgSmemBytes(kBufs), s, map, a.q, a.n,
              a.heads, a.q_lat, a.dn, a.t, a.h0, a.nh, a.scale_log2, a.span, a.partial, a.counters,
              a.o_lat);
  };
  if (bufs == 1) {
    go_wg(std::integral_constant<int, 1>{});
  } else {
    go_wg(std::integral_constant<int, 2>{});
  }
}

}  // namespace afd::kernels::cuda

// Absorbed MLA decode on bf16 tensor cores by mma.sync (AttentionTiles), DeepSeek's shape with a
// bf16 cache; mla_decode.cuh.
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

// AttentionTiles<kTok, kBufs, bulk or not> over the grid (tokens, head groups, splits); the
// opt-in above 48 KB of shared memory raised once per instance.
template <int kTok, int kBufs>
void LaunchTilesAs(bool bulk, int64_t splits, const MlaTileArgs& a, cudaStream_t s) {
  const auto kernel = bulk ? AttentionTiles<kTok, kBufs, true> : AttentionTiles<kTok, kBufs, false>;
  static const bool raised = [&] {
    for (const auto k : {AttentionTiles<kTok, kBufs, true>, AttentionTiles<kTok, kBufs, false>}) {
      AFD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(TileSmemBytes(kTok, kBufs))));
    }
    return true;
  }();
  (void)raised;
  const dim3 grid(static_cast<unsigned>((a.n + kTok - 1) / kTok),
                  static_cast<unsigned>((a.nh + kGroup - 1) / kGroup),
                  static_cast<unsigned>(splits));
  LaunchPdl(kernel, grid, kTileWarps * 32, TileSmemBytes(kTok, kBufs), s, a.q, a.n, a.heads,
            a.q_lat, a.dn, a.t, a.cache, a.h0, a.nh, a.scale_log2, a.span, a.partial, a.counters,
            a.o_lat);
}

}  // namespace

void LaunchMlaTiles(int tokens, int bufs, bool bulk, int64_t splits, const MlaTileArgs& a,
                    cudaStream_t s) {
  if (tokens == 2) {
    AFD_CHECK(bufs == 2, "AttentionTiles: two query tokens a block take two tile buffers");
    LaunchTilesAs<2, 2>(bulk, splits, a, s);
  } else if (bufs == 1) {
    LaunchTilesAs<1, 1>(bulk, splits, a, s);
  } else {
    LaunchTilesAs<1, 2>(bulk, splits, a, s);
  }
}

}  // namespace afd::kernels::cuda

// RoPE, MLA cache write and absorbed MLA attention over the paged latent cache (flash-decoding:
// every head of a group per block, the context split over blocks, one merge kernel; the W_k and
// W_v products around it are batched GEMMs in the backend, or for a few tokens the kernels
// MlaQLat / MlaOut here). DeepSeek's shape with a bf16 cache in a bf16 model runs a tiled kernel
// on bf16 tensor cores (AttentionTiles); every other case the chunked one (AttentionPartial).
// The kernels are one family per file: mla_cache.cu (RoPE, cache write), mla_project.cu (W_k /
// W_v for few tokens), mla_decode_chunks.cu, mla_decode_tiles.cu, mla_decode_wgmma.cu (what
// they share: mla_decode.cuh), mla_prefill.cu; this file chooses the decode form and its splits.
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

bool MlaTilesFit(int64_t kvr, int64_t dr, bool bf16_cache, bool tf32) {
  static const bool disabled = ChoiceOff("AFD_MLA_TILES");  // the chunked kernel
  return !disabled && bf16_cache && tf32 && kvr == kTileLatent && dr == kTileRope;
}

int64_t MlaSplits(int64_t n, int64_t nh, int64_t max_context, bool tiles, int sm_count,
                  int64_t forced) {
  const int64_t blocks = std::max<int64_t>(n * ((nh + kGroup - 1) / kGroup), 1);
  // Forced (afd bench decode --mla-splits, backend_ops_test --perf --mla-splits): at most one
  // split per tile or chunk, at most 64.
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

int64_t MlaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t kvr) {
  return n * nh * splits * (kvr + 2);
}

int64_t MlaCounters(int64_t n, int64_t nh) { return n * ((nh + kGroup - 1) / kGroup); }

void LaunchMlaAttention(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t kvr,
                        int64_t dn, int64_t dr, const PagedArgs& t, const void* cache,
                        int64_t cache_rows, bool bf16_cache, int64_t h0, int64_t h1, float scale,
                        int64_t max_context, int64_t splits, bool tf32, float* partial,
                        int* counters, float* o_lat, int sm_count, int64_t forced_bufs,
                        cudaStream_t s) {
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
    const MlaTileArgs args{
        q,  n,  heads,          q_lat, dn,      t,        static_cast<const __nv_bfloat16*>(cache),
        h0, nh, scale * kLog2e, span,  partial, counters, o_lat};
    // One tile buffer and two blocks per SM once the grid is more than one block per SM: a
    // block's next tile then loads while the other block computes (forced_bufs 1 or 2: that
    // form).
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
      LaunchMlaWg(one_buf ? 1 : 2, cache, cache_rows, splits, args, s);
      CheckLaunch("MlaAttention (wgmma)");
      return;
    }
    // Two query tokens a block (two tile buffers), or one with one or two buffers.
    LaunchMlaTiles(pairs ? 2 : 1, pairs || !one_buf ? 2 : 1, bulk, splits, args, s);
    CheckLaunch("MlaAttention (tiles)");
    return;  // the kernel writes o_lat itself (one split) or merges the splits (the last block)
  }
  LaunchMlaChunks(q, n, heads, q_lat, kvr, dn, dr, t, cache, bf16_cache, h0, h1, scale, max_context,
                  splits, tf32, partial, o_lat, s);
}

}  // namespace afd::kernels::cuda

// MLA over the paged latent cache on the CPU (the absorbed form; model/attention.h has the math
// and kernels/backend.h the op contracts). Every token is computed alone in a fixed order, so
// prefill and decode of a position give the same bits, whatever else is in the batch.
// Thread safety: pure functions over the given buffers.
#pragma once

#include <cstdint>

namespace afd::kernels::cpu {

// The cache slots of a step's tokens and their sequences' block tables (host memory).
struct PagedTokens {
  const int64_t* positions;     // [n]
  const int32_t* seq_index;     // [n]
  const int64_t* slot_mapping;  // [n]
  const int32_t* block_tables;  // [num_seqs, max_blocks]
  int64_t max_blocks;
  int64_t block_size;
};

// Rotary tables of one call: dr/2 frequencies, the attention factor, the pairing.
struct RopeParams {
  const float* inv_freq;  // [dr/2]
  int64_t dim;            // dr
  float attention_factor;
  bool interleave;
};

// Rotates `count` vectors of dr floats, the i-th at x + i·stride, for position `pos`.
void ApplyRope(const RopeParams& rope, float* x, int64_t count, int64_t stride, int64_t pos);

// cache[slot(t)] = [rmsnorm(ckv[t, :kvr]) | rope(ckv[t, kvr:])] for t < n; ckv: [n, kvr + dr].
// cache: rows of f32, or of bf16 when bf16_cache (rounded once, after the norm and the rope).
void MlaCacheWrite(const float* ckv, int64_t n, int64_t kvr, const float* norm_w, float eps,
                   const PagedTokens& tokens, const RopeParams& rope, void* cache, bool bf16_cache);

// out: [n, (h1 - h0)·dv] from q: [n, heads, dn + dr], kv_b: [heads·(dn + dv), kvr].
// cache: rows of f32, or of bf16 when bf16_cache (widened exactly to f32 as they are read).
void MlaAttention(const float* q, int64_t n, int64_t heads, const float* kv_b, int64_t kvr,
                  int64_t dn, int64_t dr, int64_t dv, const PagedTokens& tokens, const void* cache,
                  bool bf16_cache, int64_t h0, int64_t h1, float scale, float* out);

}  // namespace afd::kernels::cpu

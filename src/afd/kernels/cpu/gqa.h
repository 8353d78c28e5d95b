// Grouped-query attention over the paged key/value cache on the CPU (Qwen3; kernels/backend.h
// has the op contracts). A cache row holds [k of every KV head | v of every KV head] of one
// token. Every token is computed alone in a fixed order, so prefill and decode of a position
// give the same bits, whatever else is in the batch.
// Thread safety: pure functions over the given buffers.
#pragma once

#include <cstdint>

#include "afd/kernels/cpu/mla.h"  // PagedTokens, RopeParams

namespace afd::kernels::cpu {

// q: [n, heads, d] = rope(rmsnorm(q_h)) from qkv: [n, (heads + 2·kvh)·d]; cache[slot(t)] =
// [rope(rmsnorm(k_g)) | v_g] for tokens with a slot. cache: rows of f32, or of bf16 when
// bf16_cache (rounded once, after the norm and the rope).
void GqaCacheWrite(const float* qkv, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                   const float* q_norm, const float* k_norm, float eps, const PagedTokens& tokens,
                   const RopeParams& rope, float* q, void* cache, bool bf16_cache);

// out: [n, (h1 - h0)·d] of heads [h0, h1) of q: [n, heads, d] over the cache (head h reads KV
// head h / (heads / kvh)); rows of f32, or of bf16 when bf16_cache (widened exactly).
void GqaAttention(const float* q, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                  const PagedTokens& tokens, const void* cache, bool bf16_cache, int64_t h0,
                  int64_t h1, float scale, float* out);

}  // namespace afd::kernels::cpu

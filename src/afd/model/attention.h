// MLA (multi-head latent attention) of one layer on the CPU, in the "absorbed" form that works
// directly on the MLA cache. For head h, with W_k[h] = kv_b_proj rows of its dn key dims and
// W_v[h] those of its dv value dims (both [*, kv_lora]):
//   q_lat = W_k[h]ᵀ · q_nope                       [kv_lora]
//   score_j = (q_lat · c_j + q_pe · k_pe_j) · scale, softmax over j = 0..pos (causal)
//   o_lat = Σ_j p_j · c_j                          [kv_lora]
//   out_h = W_v[h] · o_lat                         [dv]
// which equals transformers' expanded form (k_nope_j = W_k[h]·c_j, v_j = W_v[h]·c_j) up to
// fp32 rounding. Every token is computed alone, in a fixed order: prefill and decode of a
// position give the same bits, whatever else is in the batch.
// Heads [h0, h1) can be computed alone (attention tensor parallelism).
#pragma once

#include <cstdint>

#include "afd/model/forward_batch.h"
#include "afd/model/kv_cache.h"
#include "afd/model/model_config.h"
#include "afd/model/rope.h"
#include "afd/model/weights.h"

namespace afd::model {

class MlaAttention {
 public:
  MlaAttention(const ModelConfig& config, const Rope& rope) : c_(config), rope_(rope) {}

  // The whole layer: x [n, H] (input_layernorm-ed), out [n, H] = o_proj(all heads).
  // Writes the batch's cache rows of `layer` first, then attends.
  void Forward(const AttentionWeights& w, int64_t layer, const float* x, const ForwardBatch& batch,
               MlaKvCache& cache, float* out) const;

  // Cache rows of `layer` for the batch's tokens: c = kv_a_layernorm(x·W_kv_aᵀ[:kv_lora]),
  // k_pe = rope(x·W_kv_aᵀ[kv_lora:]).
  void WriteCache(const AttentionWeights& w, int64_t layer, const float* x,
                  const ForwardBatch& batch, MlaKvCache& cache) const;

  // q of heads [h0, h1): [n, h1 - h0, dn + dr], rope applied to the last dr dims.
  void ProjectQuery(const AttentionWeights& w, const float* x, const ForwardBatch& batch,
                    int64_t h0, int64_t h1, float* q) const;

  // Attention of heads [h0, h1) given q from ProjectQuery; out: [n, (h1 - h0)·dv], heads
  // concatenated (the input of o_proj's columns of those heads).
  void AttendHeads(const AttentionWeights& w, int64_t layer, const float* q,
                   const ForwardBatch& batch, const MlaKvCache& cache, int64_t h0, int64_t h1,
                   float* out) const;

 private:
  const ModelConfig& c_;
  const Rope& rope_;
};

}  // namespace afd::model

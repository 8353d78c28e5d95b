// A DeepSeek-V2/V3 causal LM on the CPU: embedding, decoder layers (MLA attention, then a dense
// MLP or a MoE block), final norm and lm_head; hidden states are fp32 [n, H], token-major.
//
// Forward runs the whole stack; the per-layer steps are public so that the AFD attention role
// can run them and send the MoE input elsewhere:
//   x = Embed(ids)
//   for each layer l: AttentionStep(l, ...) -> x += attn(norm(x)); mlp_in = post_norm(x)
//                     mlp_out = l is MoE ? moe.Forward(l, mlp_in) : DenseMlp(l, mlp_in)
//                     x += mlp_out
//   logits = Logits(x)
// Thread safety: const methods may run concurrently on distinct caches.
#pragma once

#include <cstdint>

#include "afd/model/attention.h"
#include "afd/model/forward_batch.h"
#include "afd/model/kv_cache.h"
#include "afd/model/model_config.h"
#include "afd/model/moe_backend.h"
#include "afd/model/rope.h"
#include "afd/model/weights.h"

namespace afd::model {

class DeepseekModel {
 public:
  DeepseekModel(ModelConfig config, ModelWeights weights);
  DeepseekModel(const DeepseekModel&) = delete;
  DeepseekModel& operator=(const DeepseekModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const MlaAttention& attention() const { return attention_; }
  // An empty cache for this model; add sequences with MlaKvCache::AddSequence.
  MlaKvCache NewCache() const;

  // Runs `batch` through the model, appending its tokens to `cache` (the positions of each
  // sequence's tokens must be consecutive and start at its cache length; checked).
  // logits: [n, vocab] for every token of the batch.
  void Forward(const ForwardBatch& batch, MlaKvCache& cache, MoeBackend& moe, float* logits) const;

  // x: [n, H] = embedding rows of ids (checked against the vocabulary).
  void Embed(const int32_t* ids, int64_t n, float* x) const;
  // x: [n, H] residual stream, updated in place with the attention of `layer`;
  // mlp_in: [n, H] = post_attention_layernorm(x) afterwards.
  void AttentionStep(int64_t layer, const ForwardBatch& batch, MlaKvCache& cache, float* x,
                     float* mlp_in) const;
  // Dense MLP of a layer < first_k_dense_replace: out [n, H].
  void DenseMlp(int64_t layer, const float* mlp_in, int64_t n, float* out) const;
  // logits [n, vocab] = lm_head(norm(x)), x: [n, H].
  void Logits(const float* x, int64_t n, float* logits) const;

  // Checks that the batch continues the cache; throws afd::Error otherwise.
  void CheckBatch(const ForwardBatch& batch, const MlaKvCache& cache) const;
  // Advances each sequence's cache length past the batch's tokens.
  static void CommitBatch(const ForwardBatch& batch, MlaKvCache& cache);

 private:
  ModelConfig config_;
  ModelWeights weights_;
  Rope rope_;
  MlaAttention attention_;
};

}  // namespace afd::model

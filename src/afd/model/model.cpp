#include "afd/model/model.h"

#include <map>
#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/linear.h"
#include "afd/kernels/cpu/ops.h"
#include "afd/model/experts.h"

namespace afd::model {

DeepseekModel::DeepseekModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      rope_(config_),
      attention_(config_, rope_) {
  AFD_CHECK(static_cast<int64_t>(weights_.layers.size()) == config_.num_hidden_layers,
            "weights have {} layers, the config {}", weights_.layers.size(),
            config_.num_hidden_layers);
}

MlaKvCache DeepseekModel::NewCache() const {
  return MlaKvCache(config_.num_hidden_layers, config_.kv_lora_rank, config_.qk_rope_head_dim);
}

void DeepseekModel::CheckBatch(const ForwardBatch& batch, const MlaKvCache& cache) const {
  AFD_CHECK(batch.seq_slots.size() == batch.token_ids.size() &&
                batch.positions.size() == batch.token_ids.size(),
            "forward batch: token_ids, seq_slots and positions differ in length");
  std::map<int32_t, int64_t> next;  // slot -> expected position
  for (int64_t i = 0; i < batch.size(); ++i) {
    const int32_t slot = batch.seq_slots[i];
    AFD_CHECK(slot >= 0 && slot < cache.num_sequences(), "forward batch: no cache slot {}", slot);
    auto it = next.try_emplace(slot, cache.length(slot)).first;
    AFD_CHECK(batch.positions[i] == it->second,
              "forward batch: token {} of sequence {} has position {}, expected {}", i, slot,
              batch.positions[i], it->second);
    AFD_CHECK(batch.positions[i] < cache.capacity(slot),
              "sequence {} is full: position {} exceeds the cache capacity {}", slot,
              batch.positions[i], cache.capacity(slot));
    ++it->second;
  }
}

void DeepseekModel::CommitBatch(const ForwardBatch& batch, MlaKvCache& cache) {
  for (int64_t i = 0; i < batch.size(); ++i) {
    const int32_t slot = batch.seq_slots[i];
    if (batch.positions[i] + 1 > cache.length(slot)) cache.SetLength(slot, batch.positions[i] + 1);
  }
}

void DeepseekModel::Embed(const int32_t* ids, int64_t n, float* x) const {
  for (int64_t i = 0; i < n; ++i) {
    AFD_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size,
              "token id {} is outside the vocabulary [0, {})", ids[i], config_.vocab_size);
    weights_.embed.RowsToF32(ids[i], 1, x + i * config_.hidden_size);
  }
}

void DeepseekModel::AttentionStep(int64_t layer, const ForwardBatch& batch, MlaKvCache& cache,
                                  float* x, float* mlp_in) const {
  const int64_t n = batch.size(), h = config_.hidden_size;
  const LayerWeights& lw = weights_.layers[layer];
  std::vector<float> normed(n * h), attn(n * h);  // [n, H] each
  kernels::RmsNorm(x, n, h, lw.attn.input_norm.data(), config_.rms_norm_eps, normed.data());
  attention_.Forward(lw.attn, layer, normed.data(), batch, cache, attn.data());
  kernels::AddInPlace(x, attn.data(), n * h);
  kernels::RmsNorm(x, n, h, lw.post_attention_norm.data(), config_.rms_norm_eps, mlp_in);
}

void DeepseekModel::DenseMlp(int64_t layer, const float* mlp_in, int64_t n, float* out) const {
  AFD_CHECK(!config_.IsMoeLayer(layer), "layer {} is a MoE layer", layer);
  MlpForward(weights_.layers[layer].dense, mlp_in, n, out);
}

void DeepseekModel::Logits(const float* x, int64_t n, float* logits) const {
  std::vector<float> normed(n * config_.hidden_size);  // [n, H]
  kernels::RmsNorm(x, n, config_.hidden_size, weights_.final_norm.data(), config_.rms_norm_eps,
                   normed.data());
  kernels::Linear(normed.data(), n, weights_.lm_head, logits);
}

void DeepseekModel::Forward(const ForwardBatch& batch, MlaKvCache& cache, MoeBackend& moe,
                            float* logits) const {
  CheckBatch(batch, cache);
  const int64_t n = batch.size(), h = config_.hidden_size;
  if (n == 0) return;
  std::vector<float> x(n * h), mlp_in(n * h), mlp_out(n * h);  // [n, H] each
  Embed(batch.token_ids.data(), n, x.data());
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    AttentionStep(l, batch, cache, x.data(), mlp_in.data());
    if (config_.IsMoeLayer(l)) {
      moe.Forward(l, mlp_in.data(), n, mlp_out.data());
    } else {
      DenseMlp(l, mlp_in.data(), n, mlp_out.data());
    }
    kernels::AddInPlace(x.data(), mlp_out.data(), n * h);
  }
  CommitBatch(batch, cache);
  Logits(x.data(), n, logits);
}

}  // namespace afd::model

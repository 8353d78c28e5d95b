// The model hyper-parameters of a DeepSeek-V2 / DeepSeek-V3 or Qwen3-MoE checkpoint
// (config.json), resolved to the semantics of Hugging Face transformers 5.17 once, at parse time
// (see docs/model.md):
//  * V2 always scores experts with softmax and routes with `topk_method` greedy or
//    group_limited_greedy; it ignores norm_topk_prob; rope pairs are always interleaved.
//  * V3 always uses sigmoid + noaux_tc with e_score_correction_bias; rope_interleave (default
//    true) picks the pairing.
//  * Qwen3-MoE (qwen3_moe): GQA attention with per-head q_norm / k_norm before the rope (over the
//    whole head_dim, pairs (x[i], x[i + d/2])), softmax router over all experts, top-k,
//    renormalised when norm_topk_prob, no shared experts; layer l is MoE unless it is in
//    mlp_only_layers or (l + 1) % decoder_sparse_step != 0. The experts' count is num_experts
//    (published checkpoints) or num_local_experts (transformers 5).
//  * RoPE settings come from `rope_parameters` (transformers 5) or legacy `rope_scaling` plus a
//    top-level `rope_theta`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace afd::model {

enum class ModelType { kDeepseekV2, kDeepseekV3, kQwen3Moe };
// The attention of a model: DeepSeek's multi-head latent attention over a latent cache, or
// grouped-query attention over a cache of keys and values per KV head (Qwen3).
enum class AttentionKind { kMla, kGqa };
enum class RopeType { kDefault, kYarn };
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
enum class ScoringFunc { kSoftmax, kSigmoid };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // YaRN only.
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: not set
  double mscale_all_dim = 0.0;    // 0: not set
  double attention_factor = 0.0;  // 0: not set (derived from mscale / mscale_all_dim)
  bool truncate = true;
};

// Bounds on config.json values: every product of sizes the model computes stays far from
// int64 overflow. DeepSeek-V3 is well inside them (hidden 7168, 61 layers, 256 experts).
inline constexpr int64_t kMaxDimension = 1 << 20;  // any size, rank or head count
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxExperts = 1 << 16;

struct ModelConfig {
  ModelType model_type = ModelType::kDeepseekV2;
  // config.json's model_type: "deepseek_v2", "deepseek_v3", "qwen3_moe".
  const char* model_type_name() const;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // one routed expert; shared experts use n_shared times it
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q compression (q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // GQA (Qwen3-MoE): KV heads (num_attention_heads a multiple of them) and the head size of q, k
  // and v (independent of hidden_size / num_attention_heads).
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t first_k_dense_replace = 0;
  // Layers from first_k_dense_replace on are MoE where layer % moe_layer_freq == 0, dense
  // between (DeepSeek's own code, vLLM, SGLang). transformers ignores the field (every such
  // layer MoE): ResolveMoeLayerFreq sets it to 1 for checkpoints written that way.
  int64_t moe_layer_freq = 1;
  // Qwen3-MoE's layout: MoE where (l + 1) % decoder_sparse_step == 0 and l is not in
  // mlp_only_layers (every layer dense when the config has no experts).
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  bool norm_topk_prob = false;  // honoured for V3 and Qwen3 (transformers' V2 ignores it)
  double routed_scaling_factor = 1.0;
  float rms_norm_eps = 1e-6f;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  bool rope_interleave = true;  // pairs (x[2i], x[2i+1]); false: (x[i], x[i + dr/2])
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // quantization_config {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [n, k],
  // "activation_scheme": "dynamic"} (DeepSeek-V3's FP8 checkpoints): the weights the files store
  // as F8_E4M3 come with a weight_scale_inv of one float per [n, k] block. 0: not quantized.
  int64_t fp8_block_n = 0, fp8_block_k = 0;

  AttentionKind attention() const {
    return model_type == ModelType::kQwen3Moe ? AttentionKind::kGqa : AttentionKind::kMla;
  }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // The rotated dims of q and k (MLA: qk_rope_head_dim; GQA: all of head_dim).
  int64_t rope_dim() const {
    return attention() == AttentionKind::kGqa ? head_dim : qk_rope_head_dim;
  }
  // The dims of one head's q·k (the softmax scale is its inverse square root) and of its output.
  int64_t score_head_dim() const {
    return attention() == AttentionKind::kGqa ? head_dim : qk_head_dim();
  }
  int64_t value_head_dim() const {
    return attention() == AttentionKind::kGqa ? head_dim : v_head_dim;
  }
  // Values of one token in one layer's cache: MLA [c (kv_lora) | k_pe (dr)]; GQA [k of every KV
  // head | v of every KV head].
  int64_t cache_row_width() const {
    return attention() == AttentionKind::kGqa ? 2 * num_key_value_heads * head_dim
                                              : kv_lora_rank + qk_rope_head_dim;
  }
  bool IsMoeLayer(int64_t layer) const {
    if (model_type == ModelType::kQwen3Moe) {
      if ((layer + 1) % decoder_sparse_step != 0) return false;
      for (int64_t l : mlp_only_layers) {
        if (l == layer) return false;
      }
      return true;
    }
    return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // The MoE layers (IsMoeLayer), ascending: the order every role walks them in.
  std::vector<int> MoeLayers() const;
  int64_t num_moe_layers() const { return static_cast<int64_t>(MoeLayers().size()); }
  // Throws afd::Error naming `source` and the field when a value is out of range.
  void Validate(const std::string& source) const;
};

// Parses config.json text; `source` (a path) names the input in errors.
ModelConfig ParseModelConfig(const std::string& json_text, const std::string& source);
// Reads and parses the file at `path`.
ModelConfig LoadModelConfig(const std::string& path);

}  // namespace afd::model

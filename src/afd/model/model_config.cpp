#include "afd/model/model_config.h"

#include <climits>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "afd/common/error.h"
#include "afd/config/json_fields.h"

namespace afd::model {

namespace {

using nlohmann::json;

// Reads a numeric key, `fallback` when missing or null.
template <typename T>
T Get(const json& j, const char* key, T fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    AFD_CHECK(it->is_boolean(), "{}: \"{}\" must be a boolean, got {}", source, key,
              json_fields::Describe(*it));
  } else if constexpr (std::is_integral_v<T>) {
    // No coercion: 1.5 (or 2.0) where an integer belongs is an error, not a silent truncation.
    return static_cast<T>(json_fields::GetInt(*it, fmt::format("{}: \"{}\"", source, key),
                                              std::numeric_limits<T>::min(),
                                              std::numeric_limits<T>::max()));
  } else {
    return static_cast<T>(json_fields::GetNumber(*it, fmt::format("{}: \"{}\"", source, key),
                                                 std::numeric_limits<T>::lowest(),
                                                 std::numeric_limits<T>::max()));
  }
  return it->get<T>();
}

std::string GetString(const json& j, const char* key, const std::string& fallback,
                      const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  AFD_CHECK(it->is_string(), "{}: \"{}\" must be a string, got {}", source, key, it->dump());
  return it->get<std::string>();
}

RopeConfig ParseRope(const json& j, const std::string& source) {
  // transformers 5 writes rope_parameters (with rope_theta inside); older configs have
  // rope_scaling (maybe null) and a top-level rope_theta.
  json params = json::object();
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    params = j["rope_parameters"];
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    params = j["rope_scaling"];
  }
  AFD_CHECK(params.is_object(), "{}: rope settings must be an object, got {}", source,
            json_fields::Describe(params));
  RopeConfig rope;
  rope.theta =
      Get<double>(params, "rope_theta", Get<double>(j, "rope_theta", 10000.0, source), source);
  std::string type = GetString(params, "rope_type", "", source);
  if (type.empty()) type = GetString(params, "type", "default", source);
  if (type == "default") {
    rope.type = RopeType::kDefault;
  } else if (type == "yarn") {
    rope.type = RopeType::kYarn;
    rope.original_max_position_embeddings =
        Get<int64_t>(params, "original_max_position_embeddings",
                     Get<int64_t>(j, "max_position_embeddings", 0, source), source);
    const double fallback_factor =
        rope.original_max_position_embeddings > 0
            ? static_cast<double>(Get<int64_t>(j, "max_position_embeddings", 0, source)) /
                  rope.original_max_position_embeddings
            : 1.0;
    rope.factor = Get<double>(params, "factor", fallback_factor, source);
    rope.beta_fast = Get<double>(params, "beta_fast", 32.0, source);
    rope.beta_slow = Get<double>(params, "beta_slow", 1.0, source);
    rope.mscale = Get<double>(params, "mscale", 0.0, source);
    rope.mscale_all_dim = Get<double>(params, "mscale_all_dim", 0.0, source);
    rope.attention_factor = Get<double>(params, "attention_factor", 0.0, source);
    rope.truncate = Get<bool>(params, "truncate", true, source);
  } else {
    AFD_THROW("{}: rope type \"{}\" is not supported (supported: default, yarn)", source, type);
  }
  return rope;
}

// The experts' count of a Qwen3-MoE config: num_experts (published checkpoints) or
// num_local_experts (transformers 5); both present must agree.
int64_t Qwen3Experts(const json& j, const std::string& source) {
  const int64_t a = Get<int64_t>(j, "num_experts", -1, source);
  const int64_t b = Get<int64_t>(j, "num_local_experts", -1, source);
  AFD_CHECK(a < 0 || b < 0 || a == b,
            "{}: \"num_experts\" ({}) and \"num_local_experts\" ({}) disagree (one count of "
            "routed experts)",
            source, a, b);
  return a >= 0 ? a : (b >= 0 ? b : 128);  // transformers' default
}

// The fields of a Qwen3-MoE config (qwen3_moe) after the common ones, with transformers'
// defaults; what this runtime does not implement is refused by name.
void ParseQwen3Moe(const json& j, const std::string& source, ModelConfig& c) {
  AFD_CHECK(!Get<bool>(j, "use_sliding_window", false, source),
            "{}: \"use_sliding_window\": true is not supported (sliding-window attention); "
            "Qwen3-MoE checkpoints attend to the whole context",
            source);
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (size_t l = 0; l < j["layer_types"].size(); ++l) {
      const json& t = j["layer_types"][l];
      AFD_CHECK(t.is_string() && t.get<std::string>() == "full_attention",
                "{}: \"layer_types\"[{}] is {}; only \"full_attention\" is supported", source, l,
                t.dump());
    }
  }
  const double partial = Get<double>(j, "partial_rotary_factor", 1.0, source);
  AFD_CHECK(partial == 1.0,
            "{}: \"partial_rotary_factor\" {} is not supported (the rope rotates all of "
            "head_dim)",
            source, partial);
  c.num_key_value_heads = Get<int64_t>(j, "num_key_value_heads", c.num_attention_heads, source);
  c.head_dim = Get<int64_t>(
      j, "head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0, source);
  c.n_routed_experts = Qwen3Experts(j, source);
  c.n_shared_experts = 0;
  c.num_experts_per_tok = Get<int64_t>(j, "num_experts_per_tok", 8, source);
  c.moe_intermediate_size = Get<int64_t>(j, "moe_intermediate_size", 768, source);
  c.norm_topk_prob = Get<bool>(j, "norm_topk_prob", false, source);
  c.decoder_sparse_step = Get<int64_t>(j, "decoder_sparse_step", 1, source);
  AFD_CHECK(c.decoder_sparse_step >= 1 && c.decoder_sparse_step <= kMaxLayers,
            "{}: \"decoder_sparse_step\" must be in 1..{}, got {}", source, kMaxLayers,
            c.decoder_sparse_step);
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const json& m = j["mlp_only_layers"];
    AFD_CHECK(m.is_array(), "{}: \"mlp_only_layers\" must be a list of layer indices, got {}",
              source, json_fields::Describe(m));
    for (size_t i = 0; i < m.size(); ++i) {
      c.mlp_only_layers.push_back(json_fields::GetInt(
          m[i], fmt::format("{}: \"mlp_only_layers\"[{}]", source, i), 0, kMaxLayers - 1));
    }
  }
  if (c.n_routed_experts == 0) {  // transformers: no experts, every layer a dense MLP
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) c.mlp_only_layers.push_back(l);
  }
  c.first_k_dense_replace = 0;
  c.moe_layer_freq = 1;
  c.topk_method = TopkMethod::kGreedy;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 1.0;
  c.rope_interleave = false;  // rotate_half: pairs (x[i], x[i + d/2])
}

// DeepSeek-V2 / V3's own fields.
void ParseDeepseek(const json& j, const std::string& source, bool v3, ModelConfig& c) {
  auto req = [&](const char* key) {
    AFD_CHECK(j.contains(key), "{}: \"{}\" is missing", source, key);
    return json_fields::GetInt(j[key], fmt::format("{}: \"{}\"", source, key), INT64_MIN,
                               INT64_MAX);
  };
  c.kv_lora_rank = req("kv_lora_rank");
  c.qk_nope_head_dim = req("qk_nope_head_dim");
  c.qk_rope_head_dim = req("qk_rope_head_dim");
  c.v_head_dim = req("v_head_dim");
  c.q_lora_rank = Get<int64_t>(j, "q_lora_rank", 0, source);
  c.moe_intermediate_size = Get<int64_t>(j, "moe_intermediate_size", 0, source);
  c.n_routed_experts = Get<int64_t>(j, "n_routed_experts", 0, source);
  c.n_shared_experts = Get<int64_t>(j, "n_shared_experts", 0, source);
  c.num_experts_per_tok = Get<int64_t>(j, "num_experts_per_tok", 0, source);
  c.first_k_dense_replace = Get<int64_t>(j, "first_k_dense_replace", v3 ? 3 : 0, source);
  c.moe_layer_freq = Get<int64_t>(j, "moe_layer_freq", 1, source);
  c.n_group = Get<int64_t>(j, "n_group", v3 ? 8 : 1, source);
  c.topk_group = Get<int64_t>(j, "topk_group", v3 ? 4 : 1, source);
  c.routed_scaling_factor = Get<double>(j, "routed_scaling_factor", v3 ? 2.5 : 1.0, source);
  c.norm_topk_prob = Get<bool>(j, "norm_topk_prob", v3, source);
  if (v3) {
    // transformers' DeepseekV3 ignores scoring_func / topk_method: always sigmoid + noaux_tc.
    c.topk_method = TopkMethod::kNoauxTc;
    c.scoring_func = ScoringFunc::kSigmoid;
    c.rope_interleave = Get<bool>(j, "rope_interleave", true, source);
  } else {
    const std::string method = GetString(j, "topk_method", "greedy", source);
    if (method == "greedy") {
      c.topk_method = TopkMethod::kGreedy;
    } else if (method == "group_limited_greedy") {
      c.topk_method = TopkMethod::kGroupLimitedGreedy;
    } else {
      AFD_THROW(
          "{}: topk_method \"{}\" is not supported for deepseek_v2 (greedy, "
          "group_limited_greedy)",
          source, method);
    }
    c.scoring_func = ScoringFunc::kSoftmax;
    c.rope_interleave = true;  // V2 rotates (x[2i], x[2i+1]) as complex numbers
  }
}

}  // namespace

const char* ModelConfig::model_type_name() const {
  switch (model_type) {
    case ModelType::kDeepseekV2:
      return "deepseek_v2";
    case ModelType::kDeepseekV3:
      return "deepseek_v3";
    case ModelType::kQwen3Moe:
      return "qwen3_moe";
  }
  return "?";
}

ModelConfig ParseModelConfig(const std::string& json_text, const std::string& source) {
  const json j = json_fields::ParseStrict(json_text, source);
  AFD_CHECK(j.is_object(), "{}: config must be a JSON object", source);
  ModelConfig c;
  const std::string model_type = GetString(j, "model_type", "", source);
  const bool v3 = model_type == "deepseek_v3", qwen3 = model_type == "qwen3_moe";
  AFD_CHECK(model_type == "deepseek_v2" || v3 || qwen3,
            "{}: model_type \"{}\" is not supported (supported: deepseek_v2, deepseek_v3, "
            "qwen3_moe)",
            source, model_type);
  c.model_type =
      qwen3 ? ModelType::kQwen3Moe : (v3 ? ModelType::kDeepseekV3 : ModelType::kDeepseekV2);
  auto req = [&](const char* key) {
    AFD_CHECK(j.contains(key), "{}: \"{}\" is missing", source, key);
    return json_fields::GetInt(j[key], fmt::format("{}: \"{}\"", source, key), INT64_MIN,
                               INT64_MAX);
  };
  c.vocab_size = req("vocab_size");
  c.hidden_size = req("hidden_size");
  c.num_hidden_layers = req("num_hidden_layers");
  c.num_attention_heads = req("num_attention_heads");
  if (qwen3) {
    // Needed by dense layers only (mlp_only_layers, decoder_sparse_step): Validate checks it.
    c.intermediate_size = Get<int64_t>(j, "intermediate_size", 0, source);
    c.max_position_embeddings = Get<int64_t>(j, "max_position_embeddings", 32768, source);
  } else {
    c.intermediate_size = req("intermediate_size");
    c.max_position_embeddings = req("max_position_embeddings");
  }
  c.rms_norm_eps = static_cast<float>(Get<double>(j, "rms_norm_eps", 1e-6, source));
  c.tie_word_embeddings = Get<bool>(j, "tie_word_embeddings", false, source);
  c.bos_token_id = Get<int64_t>(j, "bos_token_id", qwen3 ? -1 : (v3 ? 0 : 1), source);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
    for (size_t i = 0; i < j["eos_token_id"].size(); ++i) {
      c.eos_token_ids.push_back(json_fields::GetInt(
          j["eos_token_id"][i], fmt::format("{}: \"eos_token_id\"[{}]", source, i), INT64_MIN,
          INT64_MAX));
    }
  } else {
    // Qwen3's config class has no default EOS (generation_config.json has them).
    const int64_t eos = Get<int64_t>(j, "eos_token_id", qwen3 ? -1 : (v3 ? 1 : 2), source);
    if (eos >= 0 || !qwen3) c.eos_token_ids.push_back(eos);
  }
  c.rope = ParseRope(j, source);
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    const std::string where = source + ": quantization_config";
    AFD_CHECK(q.is_object(), "{} must be an object", where);
    const std::string method = GetString(q, "quant_method", "", where);
    AFD_CHECK(method == "fp8",
              "{}.quant_method \"{}\" is not supported (FP8 block-quantized checkpoints are: "
              "\"fp8\")",
              where, method);
    const std::string fmt = GetString(q, "fmt", "e4m3", where);
    AFD_CHECK(fmt == "e4m3", "{}.fmt \"{}\" is not supported (e4m3)", where, fmt);
    const std::string scheme = GetString(q, "activation_scheme", "dynamic", where);
    AFD_CHECK(scheme == "dynamic",
              "{}.activation_scheme \"{}\" is not supported (dynamic: activations are not "
              "quantized with stored scales)",
              where, scheme);
    AFD_CHECK(q.contains("weight_block_size") && q["weight_block_size"].is_array() &&
                  q["weight_block_size"].size() == 2,
              "{}.weight_block_size must be [n, k] (per-tensor FP8 scales are not supported)",
              where);
    c.fp8_block_n = json_fields::GetInt(q["weight_block_size"][0], where + ".weight_block_size[0]",
                                        1, kMaxDimension);
    c.fp8_block_k = json_fields::GetInt(q["weight_block_size"][1], where + ".weight_block_size[1]",
                                        1, kMaxDimension);
  }
  AFD_CHECK(GetString(j, "hidden_act", "silu", source) == "silu",
            "{}: hidden_act \"{}\" is not supported (only silu)", source,
            GetString(j, "hidden_act", "", source));
  AFD_CHECK(
      !Get<bool>(j, "attention_bias", false, source) && !Get<bool>(j, "mlp_bias", false, source),
      "{}: attention_bias / mlp_bias = true is not supported", source);
  if (qwen3) {
    ParseQwen3Moe(j, source, c);
  } else {
    ParseDeepseek(j, source, v3, c);
  }
  c.Validate(source);
  return c;
}

std::vector<int> ModelConfig::MoeLayers() const {
  std::vector<int> layers;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    if (IsMoeLayer(l)) layers.push_back(static_cast<int>(l));
  }
  return layers;
}

void ModelConfig::Validate(const std::string& source) const {
  // Upper bounds keep every size product the model computes (weights, caches) far from
  // overflow; real DeepSeek checkpoints are well inside them.
  auto positive = [&](int64_t v, const char* name) {
    AFD_CHECK(v > 0 && v <= kMaxDimension, "{}: \"{}\" must be in 1..{}, got {}", source, name,
              kMaxDimension, v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(max_position_embeddings, "max_position_embeddings");
  if (attention() == AttentionKind::kGqa) {
    AFD_CHECK(num_key_value_heads >= 1 && num_key_value_heads <= num_attention_heads &&
                  num_attention_heads % num_key_value_heads == 0,
              "{}: \"num_key_value_heads\" must divide num_attention_heads = {}, got {}", source,
              num_attention_heads, num_key_value_heads);
    AFD_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 512,
              "{}: \"head_dim\" must be even and in [2, 512], got {}", source, head_dim);
  } else {
    positive(kv_lora_rank, "kv_lora_rank");
    positive(qk_nope_head_dim, "qk_nope_head_dim");
    positive(v_head_dim, "v_head_dim");
    AFD_CHECK(qk_rope_head_dim > 0 && qk_rope_head_dim % 2 == 0 && qk_rope_head_dim <= 512,
              "{}: qk_rope_head_dim must be even and in [2, 512], got {}", source,
              qk_rope_head_dim);
    AFD_CHECK(q_lora_rank >= 0 && q_lora_rank <= kMaxDimension,
              "{}: q_lora_rank must be in 0..{} or null, got {}", source, kMaxDimension,
              q_lora_rank);
  }
  for (int64_t l : mlp_only_layers) {
    AFD_CHECK(l >= 0 && l < num_hidden_layers,
              "{}: \"mlp_only_layers\" names layer {}, outside the {} layers", source, l,
              num_hidden_layers);
  }
  AFD_CHECK(num_hidden_layers <= kMaxLayers, "{}: \"num_hidden_layers\" must be at most {}, got {}",
            source, kMaxLayers, num_hidden_layers);
  AFD_CHECK(n_routed_experts >= 0 && n_routed_experts <= kMaxExperts,
            "{}: the routed experts' count must be in 0..{}, got {}", source, kMaxExperts,
            n_routed_experts);
  AFD_CHECK(n_shared_experts <= kMaxExperts, "{}: \"n_shared_experts\" must be at most {}", source,
            kMaxExperts);
  AFD_CHECK(moe_intermediate_size >= 0 && moe_intermediate_size <= kMaxDimension &&
                intermediate_size >= 0 && intermediate_size <= kMaxDimension,
            "{}: intermediate sizes must be in 0..{}", source, kMaxDimension);
  AFD_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps > 0,
            "{}: \"rms_norm_eps\" must be a finite number > 0, got {}", source, rms_norm_eps);
  AFD_CHECK(std::isfinite(routed_scaling_factor), "{}: \"routed_scaling_factor\" must be finite",
            source);
  AFD_CHECK(std::isfinite(rope.theta) && rope.theta > 0,
            "{}: rope_theta must be a finite number > 0, got {}", source, rope.theta);
  AFD_CHECK(first_k_dense_replace <= kMaxLayers, "{}: first_k_dense_replace must be at most {}",
            source, kMaxLayers);
  AFD_CHECK(first_k_dense_replace >= 0, "{}: first_k_dense_replace must be >= 0", source);
  AFD_CHECK(moe_layer_freq >= 1 && moe_layer_freq <= kMaxLayers,
            "{}: \"moe_layer_freq\" must be in 1..{}, got {}", source, kMaxLayers, moe_layer_freq);
  bool dense_layers = false, moe_layers = false;
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    (IsMoeLayer(l) ? moe_layers : dense_layers) = true;
  if (dense_layers) positive(intermediate_size, "intermediate_size");
  if (moe_layers) {
    positive(n_routed_experts,
             attention() == AttentionKind::kGqa ? "num_experts" : "n_routed_experts");
    positive(moe_intermediate_size, "moe_intermediate_size");
    AFD_CHECK(num_experts_per_tok > 0 && num_experts_per_tok <= n_routed_experts,
              "{}: num_experts_per_tok must be in [1, n_routed_experts = {}], got {}", source,
              n_routed_experts, num_experts_per_tok);
    AFD_CHECK(n_shared_experts >= 0, "{}: n_shared_experts must be >= 0", source);
    if (topk_method != TopkMethod::kGreedy) {
      AFD_CHECK(n_group > 0 && n_routed_experts % n_group == 0,
                "{}: n_routed_experts ({}) must be a multiple of n_group ({})", source,
                n_routed_experts, n_group);
      AFD_CHECK(topk_group > 0 && topk_group <= n_group,
                "{}: topk_group must be in [1, n_group = {}], got {}", source, n_group, topk_group);
      AFD_CHECK(topk_group * (n_routed_experts / n_group) >= num_experts_per_tok,
                "{}: topk_group groups hold fewer experts than num_experts_per_tok", source);
    }
  }
  if (rope.type == RopeType::kYarn) {
    AFD_CHECK(rope.factor > 0, "{}: rope factor must be > 0", source);
    AFD_CHECK(rope.original_max_position_embeddings > 0,
              "{}: yarn needs original_max_position_embeddings", source);
  }
  for (int64_t eos : eos_token_ids) {
    AFD_CHECK(eos >= 0 && eos < vocab_size, "{}: eos_token_id {} is outside the vocabulary", source,
              eos);
  }
}

ModelConfig LoadModelConfig(const std::string& path) {
  std::ifstream in(path);
  AFD_CHECK(in.good(), "cannot open model config {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path);
}

}  // namespace afd::model

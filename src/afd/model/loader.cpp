#include "afd/model/loader.h"

#include <fmt/ranges.h>

#include <fstream>
#include <map>
#include <sstream>

#include "afd/common/env_switches.h"
#include "afd/common/error.h"
#include "afd/model/checkpoint.h"

namespace afd::model {

namespace {

ModelConfig TinyConfig() {
  ModelConfig c;
  c.model_type = ModelType::kDeepseekV2;
  c.vocab_size = 1024;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 64;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.q_lora_rank = 64;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  c.n_group = 4;
  c.topk_group = 2;
  c.topk_method = TopkMethod::kGroupLimitedGreedy;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.routed_scaling_factor = 1.0;
  c.max_position_embeddings = 4096;
  c.rope.type = RopeType::kYarn;
  c.rope.factor = 4.0;
  c.rope.original_max_position_embeddings = 1024;
  c.rope.mscale = 0.707;
  c.rope.mscale_all_dim = 0.707;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
  return c;
}

// deepseek-ai/DeepSeek-V2-Lite config.json.
ModelConfig V2LiteConfig() {
  ModelConfig c;
  c.model_type = ModelType::kDeepseekV2;
  c.vocab_size = 102400;
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.num_hidden_layers = 27;
  c.num_attention_heads = 16;
  c.q_lora_rank = 0;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 64;
  c.n_shared_experts = 2;
  c.num_experts_per_tok = 6;
  c.first_k_dense_replace = 1;
  c.n_group = 1;
  c.topk_group = 1;
  c.topk_method = TopkMethod::kGreedy;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.routed_scaling_factor = 1.0;
  c.max_position_embeddings = 163840;
  c.rope.type = RopeType::kYarn;
  c.rope.factor = 40.0;
  c.rope.original_max_position_embeddings = 4096;
  c.rope.beta_fast = 32;
  c.rope.beta_slow = 1;
  c.rope.mscale = 0.707;
  c.rope.mscale_all_dim = 0.707;
  c.bos_token_id = 100000;
  c.eos_token_ids = {100001};
  return c;
}

// Qwen/Qwen3-30B-A3B config.json.
ModelConfig Qwen3_30bA3bConfig() {
  ModelConfig c;
  c.model_type = ModelType::kQwen3Moe;
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.moe_intermediate_size = 768;
  c.num_hidden_layers = 48;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.n_routed_experts = 128;
  c.num_experts_per_tok = 8;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.topk_method = TopkMethod::kGreedy;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.max_position_embeddings = 40960;
  c.rope.theta = 1000000.0;
  c.rope_interleave = false;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645};
  return c;
}

// A small Qwen3-MoE of the same layout (GQA 4:1, head_dim above hidden / heads, the first layer
// dense) for the CPU.
ModelConfig TinyQwen3Config() {
  ModelConfig c = Qwen3_30bA3bConfig();
  c.vocab_size = 1024;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 64;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.mlp_only_layers = {0};
  c.max_position_embeddings = 4096;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
  return c;
}

// MemAvailable of /proc/meminfo in bytes; -1 when unknown.
int64_t AvailableMemory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string key;
    int64_t kb = 0;
    if (ss >> key >> kb && key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

}  // namespace

std::vector<std::string> PresetNames() {
  return {"tiny", "deepseek-v2-lite", "tiny-qwen3", "qwen3-30b-a3b"};
}

ModelConfig PresetConfig(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    c = TinyConfig();
  } else if (name == "deepseek-v2-lite") {
    c = V2LiteConfig();
  } else if (name == "tiny-qwen3") {
    c = TinyQwen3Config();
  } else if (name == "qwen3-30b-a3b") {
    c = Qwen3_30bA3bConfig();
  } else {
    AFD_THROW("unknown preset \"{}\" (presets: {})", name, fmt::join(PresetNames(), ", "));
  }
  c.Validate("preset:" + name);
  return c;
}

namespace {

// The parameters of the attention role's part: embedding, lm_head, norms, every layer's
// attention and the dense MLPs.
int64_t AttentionParameterCount(const ModelConfig& c) {
  const int64_t h = c.hidden_size, nh = c.num_attention_heads;
  int64_t attn = 2 * h;  // the layer's two norms
  if (c.attention() == AttentionKind::kGqa) {
    const int64_t d = c.head_dim;
    attn += (nh + 2 * c.num_key_value_heads) * d * h + 2 * d + h * nh * d;
  } else {
    attn += (c.q_lora_rank == 0 ? nh * c.qk_head_dim() * h
                                : c.q_lora_rank * (h + 1 + nh * c.qk_head_dim())) +
            (c.kv_lora_rank + c.qk_rope_head_dim) * h + c.kv_lora_rank +
            nh * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank + h * nh * c.v_head_dim;
  }
  int64_t total = 2 * c.vocab_size * h + h;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += attn + (c.IsMoeLayer(l) ? 0 : 3 * h * c.intermediate_size);
  }
  return total;
}

}  // namespace

int64_t ParameterCount(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t moe = c.n_routed_experts * (h + 1) +
                      3 * h * c.moe_intermediate_size * (c.n_routed_experts + c.n_shared_experts);
  return AttentionParameterCount(c) + c.num_moe_layers() * moe;
}

namespace {

// num_layers and the preset overrides of `options` applied to `config`.
void ApplyOpenOptions(const std::string& spec, const OpenOptions& options, bool preset,
                      ModelConfig& config) {
  if (options.num_layers > 0) {
    AFD_CHECK(options.num_layers <= config.num_hidden_layers,
              "--num-layers {} exceeds the model's {} layers", options.num_layers,
              config.num_hidden_layers);
    config.num_hidden_layers = options.num_layers;
  }
  if (options.preset_vocab_size == 0 && options.preset_eos_token_ids.empty()) return;
  AFD_CHECK(preset,
            "{}: a vocabulary size and EOS ids from the tokenizer apply to presets only (a "
            "checkpoint has its own)",
            spec);
  if (options.preset_vocab_size > 0) config.vocab_size = options.preset_vocab_size;
  if (!options.preset_eos_token_ids.empty()) config.eos_token_ids = options.preset_eos_token_ids;
  config.Validate(spec);
}

}  // namespace

void ResolveMoeLayerFreq(ModelConfig& config, const Checkpoint& ckpt) {
  if (config.moe_layer_freq == 1) return;
  // The first layer the field makes dense that first_k_dense_replace alone would not.
  int64_t l = config.first_k_dense_replace;
  while (l < config.num_hidden_layers && config.IsMoeLayer(l)) ++l;
  if (l == config.num_hidden_layers) return;  // no such layer: both readings agree
  const std::string p = fmt::format("model.layers.{}.mlp.", l);
  if (ckpt.Find(p + "gate_proj.weight") != nullptr) return;  // dense there, as the field says
  AFD_CHECK(ckpt.Find(p + "gate.weight") != nullptr,
            "{}: layer {} has neither a dense MLP ({}gate_proj.weight, which moe_layer_freq {} "
            "asks for) nor a MoE router ({}gate.weight)",
            ckpt.dir(), l, p, config.moe_layer_freq, p);
  // Written by transformers, which ignores the field: every layer from first_k_dense_replace on
  // holds experts.
  config.moe_layer_freq = 1;
}

ModelConfig PeekModelConfig(const std::string& spec, const OpenOptions& options) {
  const std::string preset = "preset:";
  const bool is_preset = spec.rfind(preset, 0) == 0;
  ModelConfig config;
  if (is_preset) {
    config = PresetConfig(spec.substr(preset.size()));
  } else {
    config = LoadModelConfig(spec + "/config.json");
    if (config.moe_layer_freq != 1) ResolveMoeLayerFreq(config, Checkpoint::Open(spec));
  }
  ApplyOpenOptions(spec, options, is_preset, config);
  return config;
}

int64_t LoadedParameterCount(const ModelConfig& c, const WeightOptions& o) {
  const int64_t h = c.hidden_size, moe_layers = c.num_moe_layers();
  const int64_t expert = 3 * h * c.moe_intermediate_size;
  const int64_t end = o.expert_end < 0 ? c.n_routed_experts : o.expert_end;
  int64_t total = 0;
  if (o.load_attention) total += AttentionParameterCount(c);
  if (o.load_moe)
    total += moe_layers * (c.n_routed_experts * (h + 1) + expert * c.n_shared_experts);
  total += moe_layers * expert * std::max<int64_t>(0, end - o.expert_begin);
  return total;
}

void MoveToDevice(ModelWeights& weights, kernels::Backend& backend) {
  if (backend.device().is_cpu()) return;  // host tensors are the CPU backend's memory
  std::map<void*, Tensor> moved;          // tied tensors (lm_head = embed) move once
  ForEachTensor(weights, [&](Tensor& t) {
    auto it = moved.find(t.data());
    if (it == moved.end()) {
      std::shared_ptr<void> mem = backend.Allocate(t.nbytes());
      Tensor d(mem.get(), t.dtype(), t.shape(), backend.device(), mem);
      backend.CopyToDevice(d, t.data());
      it = moved.emplace(t.data(), d).first;
    }
    t = it->second;
  });
  backend.Synchronize();
}

std::unique_ptr<MoeModel> OpenModel(const std::string& spec, const OpenOptions& options,
                                    kernels::Backend& backend) {
  const std::string kPrefix = "preset:";
  const bool preset = spec.rfind(kPrefix, 0) == 0;
  ModelConfig config;
  std::unique_ptr<Checkpoint> ckpt;
  if (preset) {
    config = PresetConfig(spec.substr(kPrefix.size()));
  } else {
    ckpt = std::make_unique<Checkpoint>(Checkpoint::Open(spec));
    config = LoadModelConfig(ckpt->config_path());
    ResolveMoeLayerFreq(config, *ckpt);
  }
  ApplyOpenOptions(spec, options, preset, config);
  WeightOptions weights = options.weights;
  if (options.auto_bf16 && ParameterCount(config) * 4 > kAutoBf16Bytes) {
    weights.matrix_dtype = DType::kBF16;
  }
  // FP8 experts on a GPU held as FP8 (w8a8 at decode sizes, dequantized to bf16 for prefill)
  // where the backend runs them at the model's sizes: AFD_FP8_EXPERTS=1 until measured on the
  // device (docs/config.md).
  if (const std::optional<std::string> v = EnvValue("AFD_FP8_EXPERTS"); v && !v->empty()) {
    AFD_CHECK(*v == "0" || *v == "1", "AFD_FP8_EXPERTS={}: expected 0 or 1", *v);
    if (!backend.device().is_cpu() && *v == "1" &&
        backend.SupportsFp8Experts(config.hidden_size, config.moe_intermediate_size)) {
      weights.keep_fp8_experts = true;
    }
  }
  AFD_CHECK(!weights.keep_fp8_experts ||
                backend.SupportsFp8Experts(config.hidden_size, config.moe_intermediate_size),
            "{}: routed experts of hidden size {} and intermediate size {} cannot be held as FP8 "
            "on {}",
            spec, config.hidden_size, config.moe_intermediate_size, backend.name());
  // Only what this process loads counts: an FFN rank holds its experts, not the whole model.
  const int64_t need = LoadedParameterCount(config, weights) * DTypeSize(weights.matrix_dtype);
  const int64_t available = AvailableMemory();
  AFD_CHECK(available < 0 || need <= available,
            "{}: the weights need about {:.1f} GiB as {}, but only {:.1f} GiB of memory is "
            "available; use --num-layers N to keep fewer layers",
            spec, need / 1073741824.0, DTypeName(weights.matrix_dtype), available / 1073741824.0);
  ModelWeights w = preset ? RandomWeights(config, options.preset_seed, weights)
                          : LoadWeights(config, *ckpt, weights);
  MoveToDevice(w, backend);
  auto model = std::make_unique<MoeModel>(std::move(config), std::move(w), backend);
  model->set_kv_cache_dtype(
      ResolveKvCacheDType(options.kv_cache_dtype, weights.matrix_dtype, backend.device()));
  return model;
}

DType ResolveKvCacheDType(const std::string& kv_cache_dtype, DType matrix_dtype, Device device) {
  if (kv_cache_dtype == "fp32") return DType::kF32;
  if (kv_cache_dtype == "bf16") return DType::kBF16;
  AFD_CHECK(kv_cache_dtype == "auto", "--kv-cache-dtype {}: expected auto, fp32 or bf16",
            kv_cache_dtype);
  return matrix_dtype == DType::kBF16 && !device.is_cpu() ? DType::kBF16 : DType::kF32;
}

LoadedModel LoadModel(const std::string& spec, const OpenOptions& options, int cuda_device) {
  LoadedModel m;
  m.backend = kernels::MakeBackend(cuda_device >= 0 ? Device::Cuda(cuda_device) : Device::Cpu());
  m.model = OpenModel(spec, options, *m.backend);
  return m;
}

}  // namespace afd::model

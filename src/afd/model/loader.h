// Building a MoeModel from "preset:NAME" (random weights of a named shape) or from a
// Hugging Face checkpoint directory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "afd/model/checkpoint.h"
#include "afd/model/model.h"

namespace afd::model {

struct OpenOptions {
  WeightOptions weights;
  // Store big matrices as bf16 when they would not fit comfortably in fp32 (more than
  // kAutoBf16Bytes of fp32); otherwise weights.matrix_dtype is used as is.
  bool auto_bf16 = true;
  uint64_t preset_seed = 0;  // random weights of presets
  int64_t num_layers = 0;    // > 0: keep only the first num_layers decoder layers (benchmarks)
  // Presets only (random weights): the vocabulary size and EOS ids of a tokenizer they are
  // served with, so that a random model emits every id the tokenizer knows and stops at its EOS.
  // 0 / empty: the preset's own.
  int64_t preset_vocab_size = 0;
  std::vector<int64_t> preset_eos_token_ids;
  // The latent cache's rows (`--kv-cache-dtype`, vLLM's flag): "auto" (bf16 for a model with
  // bf16 matrices on a GPU, else fp32: the CPU reference stays exact), "fp32" or "bf16".
  std::string kv_cache_dtype = "auto";
};

// The cache row dtype `kv_cache_dtype` ("auto", "fp32", "bf16") means for a model whose matrices
// are `matrix_dtype` on `device`; throws afd::Error naming the flag for another value.
DType ResolveKvCacheDType(const std::string& kv_cache_dtype, DType matrix_dtype, Device device);

inline constexpr int64_t kAutoBf16Bytes = int64_t{8} << 30;

// The config of `spec` (preset:NAME or a checkpoint directory) without loading weights, as
// OpenModel with `options` would use it (layers kept, preset vocabulary and EOS).
ModelConfig PeekModelConfig(const std::string& spec, const OpenOptions& options = {});

// moe_layer_freq > 1 read from the files of `ckpt` (config.json says one thing, two writers
// another): a dense MLP where the field makes a layer dense keeps it (DeepSeek's code, vLLM);
// MoE weights there set it to 1 (transformers ignores the field); neither is an error naming
// the layer and both tensors.
void ResolveMoeLayerFreq(ModelConfig& config, const Checkpoint& ckpt);

// Names accepted after "preset:".
std::vector<std::string> PresetNames();
// The config of a preset; throws afd::Error listing the presets for an unknown name.
ModelConfig PresetConfig(const std::string& name);
// Parameter count of the weights a config implies (all experts).
int64_t ParameterCount(const ModelConfig& config);

// Parameters a process holds under `options` (its role's part: attention, router and shared
// experts, its range of routed experts).
int64_t LoadedParameterCount(const ModelConfig& config, const WeightOptions& options);

// `spec` is "preset:NAME" or a checkpoint directory; the weights end up in `backend`'s memory
// (which must outlive the model). Throws afd::Error on bad input or too little memory for the
// part this process loads.
std::unique_ptr<MoeModel> OpenModel(const std::string& spec, const OpenOptions& options,
                                    kernels::Backend& backend);

// A model and the backend it runs on, assembled in one place for every command (`afd run`,
// `afd bench`, `afd serve`, the rank processes): the backend is declared first, so it outlives
// the model.
struct LoadedModel {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<MoeModel> model;
};
// The backend of CUDA device `cuda_device` (-1: the CPU) and `spec` opened on it (OpenModel).
LoadedModel LoadModel(const std::string& spec, const OpenOptions& options, int cuda_device);

}  // namespace afd::model

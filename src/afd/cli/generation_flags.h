// The flags `afd run`, `afd worker` and `afd serve` share: which model, and how it generates.
// One definition, so a launcher passes exactly what its ranks understand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "afd/deploy/kv_sizing.h"
#include "afd/model/loader.h"
#include "afd/roles/dbo_options.h"
#include "afd/runtime/generator.h"

namespace CLI {
class App;
}

namespace afd::cli {

struct GenerationFlags {
  std::string model;  // checkpoint directory or preset:NAME
  int64_t max_tokens = 16;
  int64_t max_num_seqs = 0;
  int64_t max_num_batched_tokens = 0;
  bool ignore_eos = false;
  runtime::SamplingParams sampling;
  int64_t num_layers = 0;
  uint64_t preset_seed = 0;
  bool bf16 = false;
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype: auto, fp32, bf16 (model::OpenOptions)
  std::string quantization;             // --quantization: "" or fp8 (WeightOptions::fp8_block)
  roles::DboOptions dbo;
  bool prompt_logprobs = false;  // log-probabilities of the prompt tokens (afd run --json)
  int64_t num_kv_blocks = 0;     // --num-gpu-blocks-override; 0: room for every prompt
  // Serving engine (afd serve/launch and their workers):
  int64_t max_model_len = 0;  // prompt + new tokens at most (run: checked up front); 0: the model's
  int chunked_prefill = -1;   // -1: the command's default, 0 off, 1 on
  runtime::AsyncScheduling async_scheduling = runtime::AsyncScheduling::kAuto;  // --[no-]async-
  double gpu_memory_utilization = 0.9;        // KV cache sizing on a GPU
  double cpu_kv_cache_gib = 4.0;              // KV cache sizing on the CPU
  int64_t preset_vocab_size = 0;              // presets served with a tokenizer
  std::vector<int64_t> preset_eos_token_ids;  // likewise
};

// Registers --model (required), --max-tokens, --max-num-seqs, --max-num-batched-tokens,
// --ignore-eos, --temperature, --top-k, --top-p, --seed, --num-layers, --preset-seed, --bf16,
// --enable-dbo, --dbo-decode-token-threshold, --dbo-prefill-token-threshold,
// --prompt-logprobs, --num-gpu-blocks-override, --max-model-len, --[no-]enable-chunked-prefill,
// --[no-]async-scheduling,
// --gpu-memory-utilization, --cpu-kv-cache-gib, --preset-vocab-size, --preset-eos-token-id.
// model_required false: the command checks for a model itself (`afd serve MODEL`).
void AddGenerationFlags(CLI::App* cmd, GenerationFlags& flags, bool model_required = true);

// The same flags as a command line, for a rank process started by a launcher.
std::vector<std::string> GenerationFlagsArgv(const GenerationFlags& flags);

model::OpenOptions ToOpenOptions(const GenerationFlags& flags);
// --kv-cache-dtype auto|fp32|bf16 (model::OpenOptions::kv_cache_dtype), for commands that take it
// outside GenerationFlags.
void AddKvCacheDtypeOption(CLI::App* cmd, std::string& kv_cache_dtype);
// --quantization fp8 (vLLM's online FP8), for commands that take it without the generation flags;
// QuantizationBlock maps it to WeightOptions::fp8_block (0 when not given).
void AddQuantizationOption(CLI::App* cmd, std::string& quantization);
int64_t QuantizationBlock(const std::string& quantization);
// --dtype of a model on `device` ("cpu"/"cuda"): bf16 (the default on cuda) or fp32 weights.
void ApplyDtype(const std::string& dtype, bool cuda, model::OpenOptions& open);

// --max-model-len past the model's max_position_embeddings: an error naming the flag (0: the
// model's own).
void CheckMaxModelLen(const GenerationFlags& flags, const model::ModelConfig& config);
// Checks the sampling flags, and each prompt's ids and length (+ max_tokens) against the model.
// Throws afd::Error naming the flag or prompt (1-based), for an exit 2 before anything starts.
void ValidateGenerationInput(const GenerationFlags& flags, const model::ModelConfig& config,
                             const std::vector<std::vector<int32_t>>& prompts);
runtime::GenerationOptions ToGenerationOptions(const GenerationFlags& flags);

// The serving defaults of vLLM's online server where the flags were left at 0/unset:
// --max-num-seqs 256, --max-num-batched-tokens 2048, chunked prefill on.
void ApplyServingDefaults(GenerationFlags& flags);
runtime::EngineOptions ToEngineOptions(const GenerationFlags& flags);
deploy::KvSizing ToKvSizing(const GenerationFlags& flags);

}  // namespace afd::cli

#include "afd/cli/generation_flags.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "afd/cli/validators.h"
#include "afd/common/error.h"

namespace afd::cli {

void AddGenerationFlags(CLI::App* cmd, GenerationFlags& f, bool model_required) {
  CLI::Option* model = cmd->add_option("--model", f.model,
                                       "Checkpoint directory, or preset:tiny / "
                                       "preset:deepseek-v2-lite (random weights)");
  if (model_required) model->required();
  cmd->add_option("--max-tokens", f.max_tokens,
                  "New tokens per prompt (default 16); on a server, the default of requests "
                  "that name none (unset: 16 on completions, the rest of the context on chat)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-num-seqs", f.max_num_seqs,
                  "Running sequences per step (and DP replica) at most; 0: no limit")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-num-batched-tokens", f.max_num_batched_tokens,
                  "Tokens per step (and DP replica) at most; waiting prompts join running ones "
                  "as room frees; 0: no limit")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--ignore-eos", f.ignore_eos, "Do not stop at EOS");
  cmd->add_option("--temperature", f.sampling.temperature, "0 (default): greedy");
  cmd->add_option("--top-k", f.sampling.top_k, "0 (default): no limit");
  cmd->add_option("--top-p", f.sampling.top_p, "In (0, 1], default 1");
  cmd->add_option("--seed", f.sampling.seed, "Sampling seed (default 0)");
  cmd->add_option("--num-layers", f.num_layers,
                  "Keep only the first N decoder layers (benchmarks of big presets)");
  cmd->add_option("--preset-seed", f.preset_seed, "Seed of preset random weights (default 0)");
  cmd->add_flag("--bf16", f.bf16, "Store weight matrices as bf16 (automatic for big models)");
  AddKvCacheDtypeOption(cmd, f.kv_cache_dtype);
  AddQuantizationOption(cmd, f.quantization);
  cmd->add_flag("--enable-dbo", f.dbo.enabled,
                "AFD attention role: big steps run as two pipelined micro-batches (dual-batch "
                "overlap of attention and FFN)");
  cmd->add_flag("--prompt-logprobs", f.prompt_logprobs,
                "Compute the log-probability of every prompt token (the last one only otherwise)");
  cmd->add_option("--num-gpu-blocks-override", f.num_kv_blocks,
                  "KV cache blocks of 64 tokens (vLLM's name; also on CPU); 0 (default): room for "
                  "every prompt at full length; fewer blocks preempt and recompute sequences")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-model-len", f.max_model_len,
                  "Prompt + new tokens of a request at most (0: the model's limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag_callback(
      "--enable-chunked-prefill", [&f] { f.chunked_prefill = 1; },
      "Split prompts over steps under --max-num-batched-tokens (serving default)");
  cmd->add_flag_callback(
      "--no-enable-chunked-prefill", [&f] { f.chunked_prefill = 0; },
      "Run every prompt whole in one step");
  cmd->add_flag_callback(
      "--async-scheduling", [&f] { f.async_scheduling = runtime::AsyncScheduling::kOn; },
      "Launch a step of decodes while the one before it finishes, its ids taken on the device "
      "(the default on cuda; on the CPU it only delays each output by a step)");
  cmd->add_flag_callback(
      "--no-async-scheduling", [&f] { f.async_scheduling = runtime::AsyncScheduling::kOff; },
      "Wait for each step's sampled ids before scheduling the next");
  cmd->add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                  "Serving on a GPU: the share of its memory for weights, activations and the KV "
                  "cache (default 0.9)");
  cmd->add_option("--cpu-kv-cache-gib", f.cpu_kv_cache_gib,
                  "Serving on the CPU: GiB for the KV cache (default 4, as vLLM's "
                  "VLLM_CPU_KVCACHE_SPACE)");
  cmd->add_option("--preset-vocab-size", f.preset_vocab_size,
                  "preset models: vocabulary size (serve/launch set it from --tokenizer)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--preset-eos-token-id", f.preset_eos_token_ids,
                  "preset models: EOS ids (serve/launch set them from --tokenizer)");
  cmd->add_option("--dbo-decode-token-threshold", f.dbo.decode_token_threshold,
                  "DBO for decode-only steps of at least this many tokens per rank (default 32)")
      ->check(Positive());
  cmd->add_option("--dbo-prefill-token-threshold", f.dbo.prefill_token_threshold,
                  "DBO for steps with prefill of at least this many tokens per rank (default 512)")
      ->check(Positive());
}

std::vector<std::string> GenerationFlagsArgv(const GenerationFlags& f) {
  std::vector<std::string> v = {"--model",
                                f.model,
                                "--max-tokens",
                                std::to_string(f.max_tokens),
                                "--max-num-seqs",
                                std::to_string(f.max_num_seqs),
                                "--max-num-batched-tokens",
                                std::to_string(f.max_num_batched_tokens),
                                "--temperature",
                                fmt::format("{}", f.sampling.temperature),
                                "--top-k",
                                std::to_string(f.sampling.top_k),
                                "--top-p",
                                fmt::format("{}", f.sampling.top_p),
                                "--seed",
                                std::to_string(f.sampling.seed),
                                "--num-layers",
                                std::to_string(f.num_layers),
                                "--preset-seed",
                                std::to_string(f.preset_seed),
                                "--dbo-decode-token-threshold",
                                std::to_string(f.dbo.decode_token_threshold),
                                "--dbo-prefill-token-threshold",
                                std::to_string(f.dbo.prefill_token_threshold),
                                "--num-gpu-blocks-override",
                                std::to_string(f.num_kv_blocks)};
  v.insert(v.end(), {"--max-model-len", std::to_string(f.max_model_len), "--gpu-memory-utilization",
                     fmt::format("{}", f.gpu_memory_utilization), "--cpu-kv-cache-gib",
                     fmt::format("{}", f.cpu_kv_cache_gib), "--preset-vocab-size",
                     std::to_string(f.preset_vocab_size)});
  for (int64_t id : f.preset_eos_token_ids) {
    v.insert(v.end(), {"--preset-eos-token-id", std::to_string(id)});
  }
  if (f.chunked_prefill == 1) v.push_back("--enable-chunked-prefill");
  if (f.chunked_prefill == 0) v.push_back("--no-enable-chunked-prefill");
  if (f.prompt_logprobs) v.push_back("--prompt-logprobs");
  if (f.async_scheduling == runtime::AsyncScheduling::kOn) v.push_back("--async-scheduling");
  if (f.async_scheduling == runtime::AsyncScheduling::kOff) v.push_back("--no-async-scheduling");
  if (f.ignore_eos) v.push_back("--ignore-eos");
  if (f.bf16) v.push_back("--bf16");
  v.insert(v.end(), {"--kv-cache-dtype", f.kv_cache_dtype});
  if (!f.quantization.empty()) v.insert(v.end(), {"--quantization", f.quantization});
  if (f.dbo.enabled) v.push_back("--enable-dbo");
  return v;
}

void AddKvCacheDtypeOption(CLI::App* cmd, std::string& kv_cache_dtype) {
  cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "Latent cache rows: auto (default: bf16 for a bf16 model on cuda, else fp32), "
                  "fp32 or bf16 (half the cache memory)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
}

void AddQuantizationOption(CLI::App* cmd, std::string& quantization) {
  cmd->add_option("--quantization", quantization,
                  "fp8: quantize every Linear weight but the routers' to FP8 E4M3 on load, in "
                  "128 x 128 blocks (vLLM's online fp8; held dequantized: the reference of FP8 "
                  "weights). FP8 checkpoints need no flag: their config.json says so")
      ->check(CLI::IsMember({"fp8"}));
}

int64_t QuantizationBlock(const std::string& quantization) {
  return quantization == "fp8" ? 128 : 0;
}

model::OpenOptions ToOpenOptions(const GenerationFlags& f) {
  model::OpenOptions open;
  open.weights.fp8_block = QuantizationBlock(f.quantization);
  open.num_layers = f.num_layers;
  open.preset_seed = f.preset_seed;
  if (f.bf16) open.weights.matrix_dtype = DType::kBF16;
  open.kv_cache_dtype = f.kv_cache_dtype;
  open.preset_vocab_size = f.preset_vocab_size;
  open.preset_eos_token_ids = f.preset_eos_token_ids;
  return open;
}

void ApplyDtype(const std::string& dtype_flag, bool cuda, model::OpenOptions& open) {
  const std::string dtype = !dtype_flag.empty() ? dtype_flag : cuda ? "bf16" : "";
  if (dtype == "bf16") open.weights.matrix_dtype = DType::kBF16;
  if (dtype == "fp32") {
    open.weights.matrix_dtype = DType::kF32;
    open.auto_bf16 = false;
  }
}

void CheckMaxModelLen(const GenerationFlags& f, const model::ModelConfig& c) {
  AFD_CHECK(f.max_model_len <= c.max_position_embeddings,
            "--max-model-len {} exceeds the model's max_position_embeddings {}", f.max_model_len,
            c.max_position_embeddings);
}

void ValidateGenerationInput(const GenerationFlags& f, const model::ModelConfig& c,
                             const std::vector<std::vector<int32_t>>& prompts) {
  runtime::ValidateSamplingParams(f.sampling);
  CheckMaxModelLen(f, c);
  for (size_t s = 0; s < prompts.size(); ++s) {
    for (int32_t id : prompts[s]) {
      AFD_CHECK(id >= 0 && id < c.vocab_size,
                "prompt #{}: token id {} is outside the vocabulary [0, {})", s + 1, id,
                c.vocab_size);
    }
    const int64_t total = static_cast<int64_t>(prompts[s].size()) + f.max_tokens;
    AFD_CHECK(total <= c.max_position_embeddings,
              "prompt #{}: {} tokens + --max-tokens {} exceed max_position_embeddings {}", s + 1,
              prompts[s].size(), f.max_tokens, c.max_position_embeddings);
    AFD_CHECK(f.max_model_len == 0 || total <= f.max_model_len,
              "prompt #{}: {} tokens + --max-tokens {} exceed --max-model-len {}", s + 1,
              prompts[s].size(), f.max_tokens, f.max_model_len);
  }
}

runtime::GenerationOptions ToGenerationOptions(const GenerationFlags& f) {
  runtime::GenerationOptions g;
  g.max_tokens = f.max_tokens;
  g.max_num_seqs = f.max_num_seqs;
  g.max_num_batched_tokens = f.max_num_batched_tokens;
  g.ignore_eos = f.ignore_eos;
  g.sampling = f.sampling;
  g.prompt_logprobs = f.prompt_logprobs;
  g.num_kv_blocks = f.num_kv_blocks;
  g.chunked_prefill = f.chunked_prefill == 1;
  g.async_scheduling = f.async_scheduling;
  return g;
}

void ApplyServingDefaults(GenerationFlags& f) {
  if (f.max_num_seqs == 0) f.max_num_seqs = 256;
  if (f.max_num_batched_tokens == 0) f.max_num_batched_tokens = 2048;
  if (f.chunked_prefill < 0) f.chunked_prefill = 1;
}

runtime::EngineOptions ToEngineOptions(const GenerationFlags& f) {
  runtime::EngineOptions e;
  e.max_num_seqs = f.max_num_seqs;
  e.max_num_batched_tokens = f.max_num_batched_tokens;
  e.chunked_prefill = f.chunked_prefill == 1;
  e.async_scheduling = f.async_scheduling;
  AFD_CHECK(!e.chunked_prefill || e.max_num_batched_tokens > 0,
            "--enable-chunked-prefill needs --max-num-batched-tokens > 0");
  e.num_kv_blocks = f.num_kv_blocks;
  e.max_model_len = f.max_model_len;
  return e;
}

deploy::KvSizing ToKvSizing(const GenerationFlags& f) {
  deploy::KvSizing k;
  k.num_blocks_override = f.num_kv_blocks;
  k.gpu_memory_utilization = f.gpu_memory_utilization;
  k.cpu_kv_cache_gib = f.cpu_kv_cache_gib;
  k.max_num_seqs = f.max_num_seqs;
  k.max_num_batched_tokens = f.max_num_batched_tokens;
  k.max_model_len = f.max_model_len;
  return k;
}

}  // namespace afd::cli

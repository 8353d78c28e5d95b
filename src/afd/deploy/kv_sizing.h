// How many KV cache blocks a serving engine gets (vLLM's rules): --num-gpu-blocks-override when
// given; on a GPU, what is left of gpu_memory_utilization x total memory after the weights and
// an activation reserve; on the CPU, cpu_kv_cache_gib (vLLM's VLLM_CPU_KVCACHE_SPACE, 4 GiB by
// default) -- in both cases no more than max_num_seqs sequences of max_model_len tokens can use.
#pragma once

#include <cstdint>
#include <string>

#include "afd/model/model.h"
#include "afd/runtime/engine.h"

namespace afd::deploy {

struct KvSizing {
  int64_t num_blocks_override = 0;  // > 0: exactly this many
  double gpu_memory_utilization = 0.9;
  double cpu_kv_cache_gib = 4.0;
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;  // 0: the model's
};

// Throws afd::Error (naming the flags) when not even one sequence of max_model_len fits.
int64_t ServingKvBlocks(const model::MoeModel& model, const KvSizing& sizing);

// One line for the log: blocks, tokens, GiB.
std::string DescribeKvBlocks(const model::MoeModel& model, int64_t blocks);

// `engine` with its KV blocks sized by `sizing` when it left them at 0, the result logged on
// stderr as "<who>: KV cache: ..." (a serving rank's engine).
runtime::EngineOptions SizedServingEngine(const model::MoeModel& model,
                                          runtime::EngineOptions engine, const KvSizing& sizing,
                                          const std::string& who);

}  // namespace afd::deploy

#include "afd/deploy/kv_sizing.h"

#include <algorithm>
#include <iostream>

#include "afd/common/error.h"

namespace afd::deploy {

int64_t ServingKvBlocks(const model::MoeModel& model, const KvSizing& s) {
  const model::ModelConfig& c = model.config();
  const kv::CacheShape one = model.CacheShape(1);
  const int64_t max_len = s.max_model_len > 0 ? s.max_model_len : c.max_position_embeddings;
  const int64_t per_seq = one.BlocksFor(max_len + 1);
  if (s.num_blocks_override > 0) return s.num_blocks_override;
  AFD_CHECK(s.gpu_memory_utilization > 0 && s.gpu_memory_utilization <= 1,
            "--gpu-memory-utilization must be in (0, 1], got {}", s.gpu_memory_utilization);
  AFD_CHECK(s.cpu_kv_cache_gib > 0, "--cpu-kv-cache-gib must be > 0, got {}", s.cpu_kv_cache_gib);
  const kernels::Backend::MemoryInfo mem = model.backend().DeviceMemory();
  double budget;
  std::string what;
  if (mem.total_bytes > 0) {
    // Activations of a step: the logits of every sequence (and their sampling scratch) and a
    // few hidden-size rows per batched token, plus 1 GiB for the library workspaces.
    const double reserve = 1073741824.0 + 3.0 * 4 * s.max_num_seqs * c.vocab_size +
                           64.0 * 4 * s.max_num_batched_tokens * c.hidden_size;
    const double used = static_cast<double>(mem.total_bytes - mem.free_bytes);
    budget = s.gpu_memory_utilization * mem.total_bytes - used - reserve;
    what = fmt::format(
        "--gpu-memory-utilization {} of {:.1f} GiB, {:.1f} GiB in use, {:.1f} GiB reserved for "
        "activations",
        s.gpu_memory_utilization, mem.total_bytes / 1073741824.0, used / 1073741824.0,
        reserve / 1073741824.0);
  } else {
    budget = s.cpu_kv_cache_gib * 1073741824.0;
    what = fmt::format("--cpu-kv-cache-gib {}", s.cpu_kv_cache_gib);
  }
  const int64_t block_bytes = one.bytes();
  int64_t blocks = budget > 0 ? static_cast<int64_t>(budget / block_bytes) : 0;
  AFD_CHECK(blocks >= per_seq,
            "the KV cache gets {} blocks of {} tokens from {}, but one sequence of "
            "--max-model-len {} needs {}; lower --max-model-len or give the cache more memory",
            blocks, one.block_size, what, max_len, per_seq);
  // More than every sequence at full length could use is wasted memory.
  blocks = std::min(blocks, per_seq * std::max<int64_t>(s.max_num_seqs, 1));
  return blocks;
}

std::string DescribeKvBlocks(const model::MoeModel& model, int64_t blocks) {
  const kv::CacheShape shape = model.CacheShape(blocks);
  return fmt::format("KV cache: {} blocks of {} tokens ({} tokens, {:.2f} GiB)", blocks,
                     shape.block_size, blocks * shape.block_size, shape.bytes() / 1073741824.0);
}

runtime::EngineOptions SizedServingEngine(const model::MoeModel& model,
                                          runtime::EngineOptions engine, const KvSizing& sizing,
                                          const std::string& who) {
  if (engine.num_kv_blocks == 0) engine.num_kv_blocks = ServingKvBlocks(model, sizing);
  std::cerr << fmt::format("{}: {}", who, DescribeKvBlocks(model, engine.num_kv_blocks))
            << std::endl;
  return engine;
}

}  // namespace afd::deploy

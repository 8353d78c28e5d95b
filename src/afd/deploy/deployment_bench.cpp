#include "afd/deploy/deployment_bench.h"

#include <algorithm>

#include "afd/common/error.h"
#include "afd/model/loader.h"
#include "afd/runtime/engine.h"

namespace afd::deploy {

std::vector<DeploymentBenchRow> BenchDecodeOnDeployment(DeploymentSpec spec,
                                                        const DeploymentBenchOptions& o) {
  model::OpenOptions open;
  open.num_layers = o.num_layers;
  const model::ModelConfig config = model::PeekModelConfig(o.model, open);
  const int64_t ctx = o.context;
  const int64_t warm = runtime::GenerationStats::kWarmDecodeSteps;
  AFD_CHECK(ctx + o.steps + warm + 1 <= config.max_position_embeddings,
            "--context {} + --steps {} (+ {} warm-up steps): longer than the model's {} positions",
            ctx, o.steps, warm, config.max_position_embeddings);
  std::vector<DeploymentBenchRow> rows;
  for (int64_t batch : o.batch_sizes) {
    std::vector<std::vector<int32_t>> prompts(batch);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < ctx; ++i) {  // deterministic ids, away from the special ones
        const uint64_t h = (o.seed + 1) * 0x9E3779B97F4A7C15ull + b * 7919 + i * 104729;
        prompts[b].push_back(static_cast<int32_t>(2 + h % (config.vocab_size - 2)));
      }
    }
    spec.worker_flags = o.worker_flags(batch);
    std::vector<nlohmann::json> stats;
    RunDeployment(spec, prompts, &stats);
    double slowest_decode = 0, slowest_prefill = 0, ms = 0;
    int64_t decode_tokens = 0, prefill_tokens = 0;
    for (size_t r = 0; r < stats.size(); ++r) {
      const nlohmann::json& st = stats[r];
      // The steady decode steps: after each engine's warm-up steps (first kernel and library
      // use, as the one-process bench leaves out).
      if (st.value("steady_decode_steps", int64_t{0}) == 0) continue;
      const double ds = st["steady_decode_seconds"].get<double>();
      slowest_decode = std::max(slowest_decode, ds);
      slowest_prefill = std::max(slowest_prefill, st["prefill_seconds"].get<double>());
      ms = std::max(ms, 1e3 * ds / st["steady_decode_steps"].get<int64_t>());
      if (static_cast<int>(r) % spec.attention_tp == 0) {  // TP peers repeat them
        decode_tokens += st["steady_decode_tokens"].get<int64_t>();
        prefill_tokens += st["prefill_tokens"].get<int64_t>();
      }
    }
    AFD_CHECK(slowest_decode > 0, "no attention rank decoded (batch {})", batch);
    rows.push_back({batch, ms, decode_tokens / slowest_decode,
                    prefill_tokens / std::max(slowest_prefill, 1e-12)});
  }
  return rows;
}

}  // namespace afd::deploy

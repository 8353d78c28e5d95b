// The /metrics of the OpenAI server, under vLLM's names (vllm:*) where vLLM has one, every series
// labelled model_name: request/token counters and latency histograms fed as sequences progress,
// and gauges read from EngineClient::Load() at each scrape. Metric list in docs/server.md.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "afd/common/thread_annotations.h"
#include "afd/server/api/metrics_registry.h"
#include "afd/server/engine_client.h"

namespace afd::server::api {

class ServingMetrics {
 public:
  // max_model_len: the token histograms' last bucket (0: unknown yet, 1,000,000).
  explicit ServingMetrics(std::string model_name, int64_t max_model_len = 0);

  // One engine sequence (a choice of a request): its first output, each output after the first
  // (`gap_s` since the previous one, `num_tokens` tokens), and its end.
  void OnFirstOutput(double ttft_s, int64_t num_prompt_tokens, int64_t num_tokens);
  void OnNextOutput(double gap_s, int64_t num_tokens);
  // `reason`: "stop", "length", "abort" or "error"; the sequence's prompt and generated tokens
  // (vLLM's request_prompt_tokens / request_generation_tokens histograms).
  void OnFinished(const std::string& reason, double e2e_s, int64_t prompt_tokens = 0,
                  int64_t generation_tokens = 0);
  // A KV consumer's pull from a producer (prefill/decode disaggregation): its bytes, the
  // positions they hold and its seconds, connect to last byte; or its failure.
  // device: the rows were read over CUDA IPC (seconds: the pull of their description; the
  // engine copies them when the request is scheduled).
  void OnKvPull(int64_t bytes, int64_t positions, double seconds, bool device = false);
  void OnKvPullFailed();

  // The text exposition, with the gauges and the connector histogram taken from `load`.
  std::string Render(const EngineLoad& load);

 private:
  MetricLabels labels_;
  MetricsRegistry registry_;
  Mutex preemptions_mu_;
  int64_t preemptions_seen_ AFD_GUARDED_BY(preemptions_mu_) = 0;
};

}  // namespace afd::server::api

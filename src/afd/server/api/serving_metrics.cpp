#include "afd/server/api/serving_metrics.h"

#include "afd/common/thread_annotations.h"

namespace afd::server::api {

namespace {

// Bucket bounds as vLLM's (seconds).
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                         0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                         20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                        0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBounds = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                        5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

const std::vector<double> kKvPullBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                           0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

// vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `max`.
std::vector<double> OneTwoFive(int64_t max) {
  std::vector<double> out;
  for (int64_t scale = 1;; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max) return out;
      out.push_back(static_cast<double>(m * scale));
    }
  }
}

constexpr const char* kItl = "vllm:inter_token_latency_seconds";
constexpr const char* kTpot = "vllm:time_per_output_token_seconds";

}  // namespace

ServingMetrics::ServingMetrics(std::string model_name, int64_t max_model_len)
    : labels_{{"model_name", std::move(model_name)}} {
  const std::vector<double> token_bounds = OneTwoFive(max_model_len > 0 ? max_model_len : 1000000);
  registry_.DeclareHistogram("vllm:request_prompt_tokens",
                             "Number of prefill tokens processed, per sequence.", token_bounds);
  registry_.DeclareHistogram("vllm:request_generation_tokens",
                             "Number of generation tokens processed, per sequence.", token_bounds);
  registry_.DeclareGauge("vllm:num_requests_running",
                         "Number of sequences running in the engines.");
  registry_.DeclareGauge("vllm:num_requests_waiting",
                         "Number of sequences waiting in the engines.");
  registry_.DeclareGauge("vllm:kv_cache_usage_perc",
                         "KV-cache usage: fraction of the engines' KV blocks in use (0 to 1).");
  registry_.DeclareCounter("vllm:prompt_tokens_total", "Number of prefill tokens processed.");
  registry_.DeclareCounter("vllm:generation_tokens_total",
                           "Number of generation tokens processed.");
  registry_.DeclareCounter("vllm:request_success_total",
                           "Number of finished sequences, by finish reason.");
  registry_.DeclareCounter("vllm:num_preemptions_total", "Number of preemptions in the engines.");
  registry_.DeclareHistogram("vllm:time_to_first_token_seconds",
                             "Time from arrival to the first output token.", kTtftBounds);
  registry_.DeclareHistogram(kItl, "Time between consecutive output tokens.", kItlBounds);
  registry_.DeclareHistogram(kTpot, "Time per output token (same as inter-token latency).",
                             kItlBounds);
  registry_.DeclareHistogram("vllm:e2e_request_latency_seconds",
                             "Time from arrival to the end of a sequence.", kE2eBounds);
  registry_.DeclareGauge("afd:engine_step_seconds",
                         "Seconds the in-process engine spent in its steps since it started.");
  registry_.DeclareGauge("afd:engine_output_delivery_seconds",
                         "Seconds the in-process engine spent handing outputs to the front end "
                         "since it started (its share of engine_step_seconds: what the front "
                         "end costs the engine).");
  registry_.DeclareHistogram("afd:connector_round_trip_seconds",
                             "Per-MoE-layer connector round trip, attention -> FFN -> attention.",
                             {});
  registry_.DeclareCounter("afd:kv_transfer_bytes_total",
                           "Bytes of KV rows this consumer pulled from prefill instances.");
  registry_.DeclareCounter("afd:kv_transfer_positions_total",
                           "Prompt positions (tokens) whose KV rows this consumer pulled.");
  registry_.DeclareCounter("afd:kv_transfer_device_total",
                           "Pulls whose rows were read from the producer's GPU over CUDA IPC.");
  registry_.DeclareCounter("afd:kv_transfer_failures_total",
                           "Pulls of KV rows that failed (the request got a 502).");
  registry_.DeclareHistogram("afd:kv_transfer_seconds",
                             "Time of one pull of a request's KV rows, connect to last byte.",
                             kKvPullBounds);
  // Every series exists from the start (a scrape before the first request sees zeros).
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    MetricLabels l = labels_;
    l.emplace_back("finished_reason", reason);
    registry_.Increment("vllm:request_success_total", l, 0.0);
  }
  registry_.Increment("vllm:prompt_tokens_total", labels_, 0.0);
  registry_.Increment("vllm:generation_tokens_total", labels_, 0.0);
  registry_.Increment("vllm:num_preemptions_total", labels_, 0.0);
  registry_.SetHistogram("vllm:time_to_first_token_seconds", labels_, kTtftBounds,
                         std::vector<int64_t>(kTtftBounds.size() + 1, 0), 0, 0.0);
  registry_.SetHistogram(kItl, labels_, kItlBounds, std::vector<int64_t>(kItlBounds.size() + 1, 0),
                         0, 0.0);
  registry_.SetHistogram(kTpot, labels_, kItlBounds, std::vector<int64_t>(kItlBounds.size() + 1, 0),
                         0, 0.0);
  registry_.SetHistogram("vllm:e2e_request_latency_seconds", labels_, kE2eBounds,
                         std::vector<int64_t>(kE2eBounds.size() + 1, 0), 0, 0.0);
  registry_.Increment("afd:kv_transfer_bytes_total", labels_, 0.0);
  registry_.Increment("afd:kv_transfer_positions_total", labels_, 0.0);
  registry_.Increment("afd:kv_transfer_failures_total", labels_, 0.0);
  registry_.Increment("afd:kv_transfer_device_total", labels_, 0.0);
  registry_.SetHistogram("afd:kv_transfer_seconds", labels_, kKvPullBounds,
                         std::vector<int64_t>(kKvPullBounds.size() + 1, 0), 0, 0.0);
}

void ServingMetrics::OnKvPull(int64_t bytes, int64_t positions, double seconds, bool device) {
  if (device) registry_.Increment("afd:kv_transfer_device_total", labels_);
  registry_.Increment("afd:kv_transfer_bytes_total", labels_, static_cast<double>(bytes));
  registry_.Increment("afd:kv_transfer_positions_total", labels_, static_cast<double>(positions));
  registry_.Observe("afd:kv_transfer_seconds", labels_, seconds);
}

void ServingMetrics::OnKvPullFailed() {
  registry_.Increment("afd:kv_transfer_failures_total", labels_);
}

void ServingMetrics::OnFirstOutput(double ttft_s, int64_t num_prompt_tokens, int64_t num_tokens) {
  registry_.Observe("vllm:time_to_first_token_seconds", labels_, ttft_s);
  registry_.Increment("vllm:prompt_tokens_total", labels_, static_cast<double>(num_prompt_tokens));
  registry_.Increment("vllm:generation_tokens_total", labels_, static_cast<double>(num_tokens));
}

void ServingMetrics::OnNextOutput(double gap_s, int64_t num_tokens) {
  if (num_tokens > 0) {
    // An output of several tokens spreads its gap over them, as vLLM does per token.
    for (int64_t i = 0; i < num_tokens; ++i) {
      registry_.Observe(kItl, labels_, gap_s / static_cast<double>(num_tokens));
      registry_.Observe(kTpot, labels_, gap_s / static_cast<double>(num_tokens));
    }
  }
  registry_.Increment("vllm:generation_tokens_total", labels_, static_cast<double>(num_tokens));
}

void ServingMetrics::OnFinished(const std::string& reason, double e2e_s, int64_t prompt_tokens,
                                int64_t generation_tokens) {
  MetricLabels l = labels_;
  l.emplace_back("finished_reason", reason);
  registry_.Increment("vllm:request_success_total", l);
  registry_.Observe("vllm:e2e_request_latency_seconds", labels_, e2e_s);
  registry_.Observe("vllm:request_prompt_tokens", labels_, static_cast<double>(prompt_tokens));
  registry_.Observe("vllm:request_generation_tokens", labels_,
                    static_cast<double>(generation_tokens));
}

std::string ServingMetrics::Render(const EngineLoad& load) {
  const runtime::EngineStats& t = load.total;
  registry_.Set("vllm:num_requests_running", labels_, static_cast<double>(t.num_running));
  registry_.Set("vllm:num_requests_waiting", labels_, static_cast<double>(t.num_waiting));
  registry_.Set("vllm:kv_cache_usage_perc", labels_,
                t.kv_blocks_total > 0
                    ? static_cast<double>(t.kv_blocks_used) / static_cast<double>(t.kv_blocks_total)
                    : 0.0);
  {
    // The engines count preemptions since they started; the counter follows that total.
    MutexLock lock(preemptions_mu_);
    if (t.num_preemptions > preemptions_seen_) {
      registry_.Increment("vllm:num_preemptions_total", labels_,
                          static_cast<double>(t.num_preemptions - preemptions_seen_));
      preemptions_seen_ = t.num_preemptions;
    }
  }
  registry_.Set("afd:engine_step_seconds", labels_, load.step_seconds);
  registry_.Set("afd:engine_output_delivery_seconds", labels_, load.delivery_seconds);
  const ConnectorRoundTrips& c = load.connector;
  if (c.bucket_counts.size() == c.bucket_bounds_s.size() + 1) {
    registry_.SetHistogram("afd:connector_round_trip_seconds", labels_, c.bucket_bounds_s,
                           c.bucket_counts, c.count, c.sum_s);
  } else {
    registry_.SetHistogram("afd:connector_round_trip_seconds", labels_, {}, {0}, 0, 0.0);
  }
  return registry_.Render();
}

}  // namespace afd::server::api

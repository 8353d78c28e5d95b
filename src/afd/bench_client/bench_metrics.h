// The numbers of `afd bench serve`, computed as vLLM's benchmark computes them (numpy's mean,
// population std, median and linearly interpolated percentiles) from what the client measured
// per request. Pure functions of their arguments.
// Thread safety: none needed (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace afd::bench_client {

// One request as the client saw it. Times in seconds.
struct RequestOutcome {
  bool success = false;
  std::string error;           // why it failed (HTTP status and message, transport error)
  int64_t prompt_len = 0;      // prompt tokens (ids sent, else the server's usage count)
  int64_t output_tokens = 0;   // usage.completion_tokens, else the number of content chunks
  double start_s = 0.0;        // when it was sent, from the benchmark start
  double queue_s = 0.0;        // waited for a --max-concurrency slot before being sent
  double ttft_s = 0.0;         // send -> first content chunk
  double latency_s = 0.0;      // send -> last content chunk (end-to-end)
  std::vector<double> itl_s;   // gaps between consecutive content chunks
  std::string generated_text;  // concatenated choices[0].text
};

// Mean, median, std and the chosen percentiles of a latency, in milliseconds; all 0 for no values
// (numpy of [0], as vLLM reports an empty metric).
struct LatencyStats {
  double mean_ms = 0.0;
  double median_ms = 0.0;
  double std_ms = 0.0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value), p in [0, 100]
};

struct ServeMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;              // prompt tokens of successful requests
  int64_t total_output = 0;             // output tokens of successful requests
  double request_throughput = 0.0;      // completed / duration
  double output_throughput = 0.0;       // total_output / duration
  double total_token_throughput = 0.0;  // (total_input + total_output) / duration
  LatencyStats ttft, tpot, itl, e2el;
  std::vector<int64_t> output_lens;  // per request, 0 for a failed one
  // Content chunks received per 1-s bin from the first send of a successful request.
  std::vector<double> tokens_per_second;
  double max_output_tokens_per_s = 0.0;  // the busiest window (bench_metrics.cpp): >= the mean
  int64_t max_concurrent_requests = 0;   // peak of successful requests in flight
};

// numpy.percentile(values, p) with linear interpolation; 0 for no values. p in [0, 100].
double Percentile(std::vector<double> values, double p);
// Statistics of `values_s` (seconds) in milliseconds.
LatencyStats SummarizeMs(const std::vector<double>& values_s,
                         const std::vector<double>& percentiles);
// Everything the report prints, from the outcomes of one run lasting `duration_s` (> 0).
ServeMetrics ComputeServeMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                                 const std::vector<double>& percentiles);

}  // namespace afd::bench_client

// `afd bench serve`: a load generator for OpenAI-compatible servers (this runtime's and vLLM's)
// that behaves like `vllm bench serve`: streamed /v1/completions requests from a dataset, sent
// at a Poisson/gamma arrival rate with an optional cap on requests in flight, reported in vLLM's
// layout and result-JSON keys, optionally plotted to a PNG.
// Thread safety: RunBenchServe uses its own threads; separate calls share nothing.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>
#include <vector>

#include "afd/bench_client/bench_dataset.h"
#include "afd/bench_client/bench_metrics.h"

namespace afd::bench_client {

// Every knob of a run, checked once by ValidateBenchServeOptions (errors name the flag).
struct BenchServeOptions {
  std::string base_url;  // --base-url http://host:port
  std::string model;     // --model, the "model" of each request; empty: the server's first model
  std::string endpoint = "/v1/completions";
  std::string dataset = "random";  // "random" or a .jsonl file
  int64_t num_prompts = 1000;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;  // also the default output length of JSONL prompts
  double random_range_ratio = 0.0;
  int64_t random_vocab_size = 1000;  // random ids are drawn from [0, this)
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf: at once
  double burstiness = 1.0;      // gamma shape of the gaps; 1 is a Poisson process
  int64_t max_concurrency = 0;  // requests in flight at most; 0: no cap
  uint64_t seed = 0;
  bool ignore_eos = false;
  double temperature = 0.0;
  double request_timeout_s = 3600.0;  // bound on each request (and the reachability check)
  std::string api_key;                // sent as a bearer token when set
  std::string result_json;            // --result-json path, or empty
  std::string plot;                   // --plot path (.png), or empty
  std::vector<double> metric_percentiles = {99.0};
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  bool show_progress = true;  // progress bar on the error stream
};

// Throws afd::Error naming the flag and why when an option is out of range.
void ValidateBenchServeOptions(const BenchServeOptions& options);

// Send times of `n` requests, seconds from the start, in order: all 0 for an infinite rate, else
// cumulative gamma(shape = burstiness, scale = 1 / (rate * burstiness)) gaps (constant gaps for
// an infinite burstiness) rescaled so the last one is at n / rate (vLLM's rule). Seeded.
std::vector<double> ArrivalTimes(int64_t n, double request_rate, double burstiness, uint64_t seed);

struct BenchServeRun {
  std::vector<RequestOutcome> outcomes;  // in dataset order
  double duration_s = 0.0;               // first send .. last reply
  ServeMetrics metrics;
  std::string date;      // local time at the end, "%Y%m%d-%H%M%S"
  std::string model_id;  // --model, or the first model /v1/models lists
};

// The prompts of --dataset (random or JSONL), num_prompts of them. Throws afd::Error naming the
// flag, or the file and line.
std::vector<BenchPrompt> LoadBenchPrompts(const BenchServeOptions& options);

// Sends `prompts` (one request each). Throws afd::Error for a server that cannot be reached at
// all (checked with GET /v1/models before the run; the message names the URL), or, without
// --model, one that lists no model. Failed requests
// are counted, not thrown. `progress` (may be null) gets a progress bar.
BenchServeRun RunBenchServe(const BenchServeOptions& options,
                            const std::vector<BenchPrompt>& prompts, std::ostream* progress);

// The report, line for line as `vllm bench serve` prints it (only the metrics listed in
// percentile_metrics get a section).
std::string FormatBenchServeReport(const BenchServeOptions& options, const BenchServeRun& run);
// vLLM's result JSON (its keys, per-request arrays included) as text.
std::string BenchServeResultJson(const BenchServeOptions& options, const BenchServeRun& run);

// The whole command: run, print errors and the report to `out`, write --result-json and --plot.
// Returns the exit code: 0, 1 when every request failed or the server is unreachable, 2 for
// invalid options or dataset; messages go to `err`.
int BenchServeMain(const BenchServeOptions& options, std::ostream& out, std::ostream& err);

}  // namespace afd::bench_client

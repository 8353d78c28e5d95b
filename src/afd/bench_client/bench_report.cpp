// The text report, the result JSON and the command of `afd bench serve` (declared in
// bench_serve.h).
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "afd/bench_client/bench_plot.h"
#include "afd/bench_client/bench_serve.h"
#include "afd/common/error.h"

namespace afd::bench_client {

namespace {

// A float as Python's str() prints it in vLLM's preamble ("inf", "4.0", "0.5").
std::string PyFloat(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e16) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

// "99" for 99.0, "99.9" for 99.9 (vLLM's p_word).
std::string PercentileWord(double p) {
  return p == std::floor(p) ? fmt::format("{}", static_cast<int64_t>(p)) : fmt::format("{}", p);
}

struct MetricSection {
  const char* key;     // "ttft"
  const char* name;    // "TTFT"
  const char* header;  // "Time to First Token"
  const LatencyStats* stats;
};

std::vector<MetricSection> Sections(const BenchServeOptions& o, const ServeMetrics& m) {
  const MetricSection all[] = {
      {"ttft", "TTFT", "Time to First Token", &m.ttft},
      {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &m.tpot},
      {"itl", "ITL", "Inter-token Latency", &m.itl},
      {"e2el", "E2EL", "End-to-end Latency", &m.e2el},
  };
  std::vector<MetricSection> chosen;
  for (const MetricSection& s : all) {
    for (const std::string& name : o.percentile_metrics) {
      if (name == s.key) chosen.push_back(s);
    }
  }
  return chosen;
}

void Line(std::string& out, const std::string& label, const std::string& value) {
  out += fmt::format("{:<40} {:<10}\n", label, value);
}

void WriteFile(const std::string& flag, const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  AFD_CHECK(f.good(), "{} {}: cannot open the file for writing", flag, path);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  AFD_CHECK(f.good(), "{} {}: writing the file failed", flag, path);
}

}  // namespace

std::string FormatBenchServeReport(const BenchServeOptions& o, const BenchServeRun& run) {
  const ServeMetrics& m = run.metrics;
  const auto f2 = [](double v) { return fmt::format("{:<10.2f}", v); };
  std::string out = fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  Line(out, "Successful requests:", fmt::format("{}", m.completed));
  Line(out, "Failed requests:", fmt::format("{}", m.failed));
  if (o.max_concurrency > 0) {
    Line(out, "Maximum request concurrency:", fmt::format("{}", o.max_concurrency));
  }
  if (!std::isinf(o.request_rate)) Line(out, "Request rate configured (RPS):", f2(o.request_rate));
  Line(out, "Benchmark duration (s):", f2(run.duration_s));
  Line(out, "Total input tokens:", fmt::format("{}", m.total_input));
  Line(out, "Total generated tokens:", fmt::format("{}", m.total_output));
  Line(out, "Request throughput (req/s):", f2(m.request_throughput));
  Line(out, "Output token throughput (tok/s):", f2(m.output_throughput));
  Line(out, "Peak output token throughput (tok/s):", f2(m.max_output_tokens_per_s));
  Line(out, "Peak concurrent requests:", f2(static_cast<double>(m.max_concurrent_requests)));
  Line(out, "Total Token throughput (tok/s):", f2(m.total_token_throughput));
  for (const MetricSection& s : Sections(o, m)) {
    out += fmt::format("{:-^50}\n", s.header);
    Line(out, fmt::format("Mean {} (ms):", s.name), f2(s.stats->mean_ms));
    Line(out, fmt::format("Median {} (ms):", s.name), f2(s.stats->median_ms));
    for (const auto& [p, value] : s.stats->percentiles_ms) {
      Line(out, fmt::format("P{} {} (ms):", PercentileWord(p), s.name), f2(value));
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

std::string BenchServeResultJson(const BenchServeOptions& o, const BenchServeRun& run) {
  const ServeMetrics& m = run.metrics;
  nlohmann::ordered_json j;
  j["date"] = run.date;
  j["endpoint_type"] = "openai";
  j["backend"] = "openai";
  j["label"] = nullptr;
  j["model_id"] = run.model_id;
  j["tokenizer_id"] = nullptr;
  j["num_prompts"] = o.num_prompts;
  if (std::isinf(o.request_rate)) {
    j["request_rate"] = "inf";
  } else {
    j["request_rate"] = o.request_rate;
  }
  j["burstiness"] = o.burstiness;
  j["max_concurrency"] = o.max_concurrency > 0 ? nlohmann::ordered_json(o.max_concurrency)
                                               : nlohmann::ordered_json(nullptr);
  j["duration"] = run.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = nullptr;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  auto& input_lens = j["input_lens"] = nlohmann::ordered_json::array();
  j["output_lens"] = m.output_lens;
  auto& ttfts = j["ttfts"] = nlohmann::ordered_json::array();
  auto& itls = j["itls"] = nlohmann::ordered_json::array();
  auto& latencies = j["latencies"] = nlohmann::ordered_json::array();
  auto& start_times = j["start_times"] = nlohmann::ordered_json::array();
  auto& queue_times = j["queue_times"] = nlohmann::ordered_json::array();
  auto& texts = j["generated_texts"] = nlohmann::ordered_json::array();
  auto& errors = j["errors"] = nlohmann::ordered_json::array();
  for (const RequestOutcome& r : run.outcomes) {
    input_lens.push_back(r.prompt_len);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itl_s);
    latencies.push_back(r.latency_s);
    start_times.push_back(r.start_s);
    queue_times.push_back(r.queue_s);
    texts.push_back(r.generated_text);
    errors.push_back(r.error);
  }
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  j["rtfx"] = 0.0;
  for (const MetricSection& s : Sections(o, m)) {
    j[fmt::format("mean_{}_ms", s.key)] = s.stats->mean_ms;
    j[fmt::format("median_{}_ms", s.key)] = s.stats->median_ms;
    j[fmt::format("std_{}_ms", s.key)] = s.stats->std_ms;
    for (const auto& [p, value] : s.stats->percentiles_ms) {
      j[fmt::format("p{}_{}_ms", PercentileWord(p), s.key)] = value;
    }
  }
  // Strings from the server (texts, errors) may hold invalid UTF-8: replace, never throw.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

int BenchServeMain(const BenchServeOptions& o, std::ostream& out, std::ostream& err) {
  std::vector<BenchPrompt> prompts;
  try {
    prompts = LoadBenchPrompts(o);
  } catch (const Error& e) {
    err << "afd bench serve: " << e.what() << "\n";
    return 2;
  }
  out << "Starting main benchmark run...\n";
  out << "Traffic request rate: " << PyFloat(o.request_rate) << "\n";
  out << "Burstiness factor: " << PyFloat(o.burstiness) << " ("
      << (o.burstiness == 1.0 ? "Poisson process" : "Gamma distribution") << ")\n";
  out << "Maximum request concurrency: "
      << (o.max_concurrency > 0 ? std::to_string(o.max_concurrency) : "None") << "\n"
      << std::flush;
  BenchServeRun run;
  try {
    run = RunBenchServe(o, prompts, o.show_progress ? &err : nullptr);
  } catch (const Error& e) {
    err << "afd bench serve: " << e.what() << "\n";
    return 1;
  }
  int64_t shown = 0;
  for (const RequestOutcome& r : run.outcomes) {
    if (r.success || shown == 10) continue;
    if (shown == 0) out << "Failed requests during benchmark run detected (capping to 10):\n";
    out << "Error " << shown++ << ": " << r.error << "\n";
  }
  out << FormatBenchServeReport(o, run) << std::flush;
  try {
    if (!o.result_json.empty()) {
      WriteFile("--result-json", o.result_json, BenchServeResultJson(o, run) + "\n");
    }
    if (!o.plot.empty()) WriteFile("--plot", o.plot, BenchServePlotPng(run));
  } catch (const Error& e) {
    err << "afd bench serve: " << e.what() << "\n";
    return 1;
  }
  if (run.metrics.completed == 0) {
    std::string first_error;
    for (const RequestOutcome& r : run.outcomes) {
      if (!r.error.empty()) {
        first_error = r.error;
        break;
      }
    }
    err << fmt::format(
        "afd bench serve: every request failed ({} of {}) against {}; first error: {}\n",
        run.metrics.failed, run.outcomes.size(), o.base_url, first_error);
    return 1;
  }
  return 0;
}

}  // namespace afd::bench_client

#include "afd/server/client/bench_metrics.h"

#include <algorithm>
#include <cmath>

namespace afd::server::client {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

LatencyStats SummarizeMs(const std::vector<double>& values_s,
                         const std::vector<double>& percentiles) {
  LatencyStats s;
  for (const double p : percentiles) s.percentiles_ms.emplace_back(p, 0.0);
  if (values_s.empty()) return s;
  double sum = 0.0;
  for (const double v : values_s) sum += v;
  const double mean = sum / static_cast<double>(values_s.size());
  double sq = 0.0;
  for (const double v : values_s) sq += (v - mean) * (v - mean);
  s.mean_ms = mean * 1000.0;
  s.std_ms = std::sqrt(sq / static_cast<double>(values_s.size())) * 1000.0;
  s.median_ms = Percentile(values_s, 50.0) * 1000.0;
  for (auto& [p, value] : s.percentiles_ms) value = Percentile(values_s, p) * 1000.0;
  return s;
}

namespace {

// Output tokens per 1-s bin and the peak number of requests in flight, over successful ones.
// A chunk may carry several tokens (the server coalesces the tokens of one step, or of steps its
// client read late): each chunk of a request counts output_tokens / chunks, so the bins sum to the
// output tokens and the peak can never read below the mean.
void ThroughputOverTime(const std::vector<RequestOutcome>& outcomes, ServeMetrics& m) {
  double first = 0.0, last = 0.0;
  bool any = false;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) continue;
    first = any ? std::min(first, o.start_s) : o.start_s;
    last = any ? std::max(last, o.start_s + o.latency_s) : o.start_s + o.latency_s;
    any = true;
  }
  if (!any) return;
  const size_t bins = static_cast<size_t>(std::ceil(last - first)) + 1;
  m.tokens_per_second.assign(bins, 0.0);
  std::vector<std::pair<double, int>> events;  // (time, +1 start / -1 end)
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) continue;
    double t = o.start_s + o.ttft_s;
    const double chunks = static_cast<double>(o.itl_s.size() + 1);
    const double per_chunk =
        o.output_tokens > 0 ? static_cast<double>(o.output_tokens) / chunks : 1.0;
    const auto add = [&](double at) {
      const double bin = std::floor(at - first);
      if (bin >= 0 && bin < static_cast<double>(bins)) {
        m.tokens_per_second[size_t(bin)] += per_chunk;
      }
    };
    add(t);
    for (const double gap : o.itl_s) add(t += gap);
    events.emplace_back(o.start_s, 1);
    events.emplace_back(o.start_s + o.latency_s, -1);
  }
  // Half-open intervals: an end at the same instant as a start comes first.
  std::sort(events.begin(), events.end());
  int64_t now = 0;
  for (const auto& [at, delta] : events) {
    now += delta;
    m.max_concurrent_requests = std::max(m.max_concurrent_requests, now);
  }
  m.max_output_tokens_per_s =
      *std::max_element(m.tokens_per_second.begin(), m.tokens_per_second.end());
}

}  // namespace

ServeMetrics ComputeServeMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                                 const std::vector<double>& percentiles) {
  ServeMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) {
      ++m.failed;
      m.output_lens.push_back(0);
      continue;
    }
    ++m.completed;
    m.output_lens.push_back(o.output_tokens);
    m.total_input += o.prompt_len;
    m.total_output += o.output_tokens;
    if (o.output_tokens > 1) {
      tpots.push_back((o.latency_s - o.ttft_s) / static_cast<double>(o.output_tokens - 1));
    }
    itls.insert(itls.end(), o.itl_s.begin(), o.itl_s.end());
    ttfts.push_back(o.ttft_s);
    e2els.push_back(o.latency_s);
  }
  m.request_throughput = static_cast<double>(m.completed) / duration_s;
  m.output_throughput = static_cast<double>(m.total_output) / duration_s;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  m.ttft = SummarizeMs(ttfts, percentiles);
  m.tpot = SummarizeMs(tpots, percentiles);
  m.itl = SummarizeMs(itls, percentiles);
  m.e2el = SummarizeMs(e2els, percentiles);
  ThroughputOverTime(outcomes, m);
  return m;
}

}  // namespace afd::server::client

#include "afd/bench_client/bench_metrics.h"

#include <algorithm>
#include <cmath>

namespace afd::bench_client {

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

// Output tokens per 1-s bin (the plot's), the peak output rate and the peak number of requests in
// flight, over successful ones.
// A chunk may carry several tokens (the server coalesces the tokens of one step, or of steps its
// client read late): each chunk of a request counts output_tokens / chunks, so the bins sum to the
// output tokens and the peak can never read below the mean.
void ThroughputOverTime(const std::vector<RequestOutcome>& outcomes, double duration_s,
                        ServeMetrics& m) {
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
  std::vector<std::pair<double, int>> events;        // (time, +1 start / -1 end)
  std::vector<std::pair<double, double>> chunks_at;  // (time, tokens) of every chunk
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
      chunks_at.emplace_back(at, per_chunk);
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
  // The peak: the busiest window of w = D / ceil(D) seconds (1 s for a run of whole seconds,
  // never under 0.5 s; the run itself when shorter than 1 s), sliding over the chunks. ceil(D)
  // such windows tile the run, so the busiest holds at least total / ceil(D) tokens: the peak
  // never reads below the mean (whole 1-s bins would, for a run of 1.5 s).
  const double span = std::max(duration_s, last - first);
  const double w = span > 0 ? span / std::ceil(span) : 1.0;
  std::sort(chunks_at.begin(), chunks_at.end());
  double in_window = 0.0, best = 0.0;
  size_t end = 0;
  for (size_t begin = 0; begin < chunks_at.size(); ++begin) {
    while (end < chunks_at.size() && chunks_at[end].first <= chunks_at[begin].first + w) {
      in_window += chunks_at[end++].second;
    }
    best = std::max(best, in_window);
    in_window -= chunks_at[begin].second;
  }
  m.max_output_tokens_per_s = best / w;
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
  ThroughputOverTime(outcomes, duration_s, m);
  return m;
}

}  // namespace afd::bench_client

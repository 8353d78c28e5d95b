// `afd bench serve` metric math against hand-computed numbers, arrival times and datasets.
#include "afd/bench_client/bench_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "afd/bench_client/bench_dataset.h"
#include "afd/bench_client/bench_serve.h"
#include "afd/common/error.h"

namespace afd::bench_client {
namespace {

TEST(BenchServeMetrics, PercentileInterpolatesLikeNumpy) {
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 99), 3.97);  // 3 + 0.97 * (4 - 3)
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 0), 1.0);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 100), 4.0);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(Percentile({}, 99), 0.0);
}

TEST(BenchServeMetrics, SummaryIsInMillisecondsWithPopulationStd) {
  const LatencyStats s = SummarizeMs({0.1, 0.1, 0.1, 1.0}, {99, 50});
  EXPECT_NEAR(s.mean_ms, 325.0, 1e-9);
  EXPECT_NEAR(s.median_ms, 100.0, 1e-9);
  EXPECT_NEAR(s.std_ms, std::sqrt(0.151875) * 1000, 1e-9);
  ASSERT_EQ(s.percentiles_ms.size(), 2u);
  EXPECT_EQ(s.percentiles_ms[0].first, 99);
  EXPECT_NEAR(s.percentiles_ms[0].second, 973.0, 1e-9);
  EXPECT_NEAR(s.percentiles_ms[1].second, 100.0, 1e-9);
  const LatencyStats empty = SummarizeMs({}, {99});
  EXPECT_EQ(empty.mean_ms, 0.0);
  EXPECT_EQ(empty.percentiles_ms.at(0).second, 0.0);
}

TEST(BenchServeMetrics, RunMetricsMatchHandComputedValues) {
  RequestOutcome a;
  a.success = true;
  a.prompt_len = 10;
  a.output_tokens = 4;
  a.start_s = 0.0;
  a.ttft_s = 0.1;
  a.latency_s = 0.4;
  a.itl_s = {0.1, 0.1, 0.1};
  RequestOutcome b;
  b.success = true;
  b.prompt_len = 20;
  b.output_tokens = 2;
  b.start_s = 0.4;  // starts exactly when a ends: never two in flight
  b.ttft_s = 0.2;
  b.latency_s = 1.2;
  b.itl_s = {1.0};
  RequestOutcome c;  // failed: counts nowhere but in `failed` and output_lens
  c.error = "HTTP 400: bad";
  c.prompt_len = 1000;
  c.output_tokens = 7;
  const ServeMetrics m = ComputeServeMetrics({a, c, b}, 2.0, {99});
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);
  EXPECT_EQ(m.total_output, 6);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{4, 0, 2}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 18.0);
  EXPECT_NEAR(m.ttft.mean_ms, 150.0, 1e-9);
  EXPECT_NEAR(m.ttft.std_ms, 50.0, 1e-9);
  EXPECT_NEAR(m.ttft.percentiles_ms[0].second, 199.0, 1e-9);
  // TPOT: (0.4 - 0.1) / 3 = 0.1 s and (1.2 - 0.2) / 1 = 1.0 s.
  EXPECT_NEAR(m.tpot.mean_ms, 550.0, 1e-9);
  EXPECT_NEAR(m.tpot.median_ms, 550.0, 1e-9);
  EXPECT_NEAR(m.tpot.std_ms, 450.0, 1e-9);
  EXPECT_NEAR(m.tpot.percentiles_ms[0].second, 991.0, 1e-9);
  EXPECT_NEAR(m.itl.mean_ms, 325.0, 1e-9);
  EXPECT_NEAR(m.itl.percentiles_ms[0].second, 973.0, 1e-9);
  EXPECT_NEAR(m.e2el.mean_ms, 800.0, 1e-9);
  EXPECT_NEAR(m.e2el.percentiles_ms[0].second, 1192.0, 1e-9);
  // Chunks at 0.1 0.2 0.3 0.4 (a) and 0.6 1.6 (b); span 1.6 s -> ceil + 1 = 3 bins.
  EXPECT_EQ(m.tokens_per_second, (std::vector<double>{5, 1, 0}));
  EXPECT_EQ(m.max_output_tokens_per_s, 5.0);
  EXPECT_EQ(m.max_concurrent_requests, 1);
}

// A chunk that carries several tokens counts them all: the bins sum to the output tokens and the
// peak never reads below the mean output throughput.
TEST(BenchServeMetrics, ChunksOfSeveralTokensCountEveryToken) {
  RequestOutcome a;
  a.success = true;
  a.output_tokens = 12;  // in 3 chunks, at 0.1, 0.3 and 0.5 s
  a.ttft_s = 0.1;
  a.itl_s = {0.2, 0.2};
  a.latency_s = 0.5;
  const ServeMetrics m = ComputeServeMetrics({a}, 0.5, {99});
  EXPECT_EQ(m.tokens_per_second, (std::vector<double>{12, 0}));
  // A run of 0.5 s: its window is the run, 12 tokens in 0.5 s.
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 24.0);
  EXPECT_GE(m.max_output_tokens_per_s, m.output_throughput);
}

// A run of 1.5 s whose whole 1-s bins hold fewer tokens than its mean rate: the peak's windows
// (0.75 s here) tile the run, so the peak never reads below the mean.
TEST(BenchServeMetrics, PeakIsNeverBelowTheMean) {
  RequestOutcome a;
  a.success = true;
  a.output_tokens = 30;  // one token every 0.05 s from 0.05 to 1.5 s
  a.ttft_s = 0.05;
  a.itl_s.assign(29, 0.05);
  a.latency_s = 1.5;
  const ServeMetrics m = ComputeServeMetrics({a}, 1.5, {99});
  EXPECT_DOUBLE_EQ(m.output_throughput, 20.0);
  EXPECT_GE(m.max_output_tokens_per_s, m.output_throughput);
  EXPECT_LE(m.max_output_tokens_per_s, 30.0 / 0.75 + 1e-9);
}

TEST(BenchServeMetrics, AllFailedGivesZerosNotNaN) {
  RequestOutcome f;
  f.error = "x";
  const ServeMetrics m = ComputeServeMetrics({f, f}, 1.0, {99});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.ttft.mean_ms, 0.0);
  EXPECT_TRUE(m.tokens_per_second.empty());
  EXPECT_EQ(m.max_concurrent_requests, 0);
}

TEST(BenchServeArrivals, InfiniteRateSendsAllAtOnce) {
  EXPECT_EQ(ArrivalTimes(3, std::numeric_limits<double>::infinity(), 1.0, 0),
            (std::vector<double>{0, 0, 0}));
}

TEST(BenchServeArrivals, GammaGapsAreSeededAndRescaledToNOverRate) {
  const std::vector<double> a = ArrivalTimes(50, 10.0, 1.0, 7);
  ASSERT_EQ(a.size(), 50u);
  EXPECT_NEAR(a.back(), 5.0, 1e-9);
  for (size_t i = 1; i < a.size(); ++i) EXPECT_GE(a[i], a[i - 1]);
  EXPECT_EQ(a, ArrivalTimes(50, 10.0, 1.0, 7));
  EXPECT_NE(a, ArrivalTimes(50, 10.0, 1.0, 8));
  // Burstiness inf: evenly spaced.
  const std::vector<double> even = ArrivalTimes(4, 2.0, std::numeric_limits<double>::infinity(), 0);
  EXPECT_EQ(even, (std::vector<double>{0.5, 1.0, 1.5, 2.0}));
}

TEST(BenchServeDataset, RandomLengthsAndIdsStayInRangeAndAreSeeded) {
  RandomDatasetOptions o;
  o.num_prompts = 200;
  o.input_len = 10;
  o.output_len = 20;
  o.range_ratio = 0.5;
  o.vocab_size = 50;
  o.seed = 3;
  const std::vector<BenchPrompt> p = RandomDataset(o);
  ASSERT_EQ(p.size(), 200u);
  size_t min_in = 1000, max_in = 0;
  for (const BenchPrompt& q : p) {
    EXPECT_FALSE(q.is_text);
    min_in = std::min(min_in, q.ids.size());
    max_in = std::max(max_in, q.ids.size());
    EXPECT_GE(q.output_len, 10);
    EXPECT_LE(q.output_len, 30);
    for (const int64_t id : q.ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 50);
    }
  }
  EXPECT_EQ(min_in, 5u);   // floor(10 * 0.5)
  EXPECT_EQ(max_in, 15u);  // ceil(10 * 1.5)
  const std::vector<BenchPrompt> again = RandomDataset(o);
  EXPECT_EQ(again[17].ids, p[17].ids);
  o.range_ratio = 1.0;
  EXPECT_THROW(RandomDataset(o), Error);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(BenchServeDataset, JsonlTakesTextIdsAndOutputLensAndCycles) {
  const std::string path = WriteTemp("bench_ok.jsonl",
                                     "{\"prompt\": \"hello\", \"output_len\": 3}\n"
                                     "\n"
                                     "{\"prompt\": [1, 2, 3], \"max_tokens\": 5}\n"
                                     "{\"prompt\": \"no length\"}\n");
  const std::vector<BenchPrompt> p = LoadJsonlDataset(path, 5, 9);
  ASSERT_EQ(p.size(), 5u);
  EXPECT_TRUE(p[0].is_text);
  EXPECT_EQ(p[0].text, "hello");
  EXPECT_EQ(p[0].output_len, 3);
  EXPECT_EQ(p[1].ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(p[1].output_len, 5);
  EXPECT_EQ(p[2].output_len, 9);
  EXPECT_EQ(p[3].text, "hello");
  EXPECT_EQ(p[4].ids.size(), 3u);
}

void ExpectJsonlError(const std::string& text, const std::string& needle) {
  const std::string path = WriteTemp("bench_bad.jsonl", text);
  try {
    LoadJsonlDataset(path, 1, 4);
    ADD_FAILURE() << "no error for " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":" + needle), std::string::npos) << e.what();
  }
}

TEST(BenchServeDataset, JsonlErrorsNameFileAndLine) {
  ExpectJsonlError("{\"prompt\": \"a\"}\nnot json\n", "2: not JSON");
  ExpectJsonlError("{\"text\": \"a\"}\n", "1: expected an object with \"prompt\"");
  ExpectJsonlError("\n{\"prompt\": [1, -2]}\n", "2: \"prompt\" has -2");
  ExpectJsonlError("{\"prompt\": \"a\", \"output_len\": 0}\n", "1: \"output_len\" must be");
  EXPECT_THROW(LoadJsonlDataset(::testing::TempDir() + "/missing.jsonl", 1, 4), Error);
}

}  // namespace
}  // namespace afd::bench_client

#include "afd/bench_client/bench_serve.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <thread>

#include "afd/bench_client/bench_request.h"
#include "afd/bench_client/http_stream_client.h"
#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"

namespace afd::bench_client {

namespace {

using Clock = std::chrono::steady_clock;

// Threads that send requests when no --max-concurrency caps them: enough to keep any server
// busy, few enough for a client machine.
constexpr int64_t kMaxSenderThreads = 1024;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string LocalDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// Requests that have arrived and wait for a sender; senders take them in arrival order.
class ArrivalQueue {
 public:
  void Push(size_t index) {
    {
      MutexLock lock(mu_);
      queue_.push_back(index);
    }
    cv_.notify_one();
  }
  void Close() {
    {
      MutexLock lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // The next arrived request, or false once closed and drained.
  bool Pop(size_t& index) {
    MutexLock lock(mu_);
    while (!closed_ && queue_.empty()) cv_.wait(lock);
    if (queue_.empty()) return false;
    index = queue_.front();
    queue_.pop_front();
    return true;
  }

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<size_t> queue_ AFD_GUARDED_BY(mu_);
  bool closed_ AFD_GUARDED_BY(mu_) = false;
};

// "\r 37/100 [#########           ]  37% elapsed 12.3s", redrawn in place.
void DrawProgress(std::ostream& out, int64_t done, int64_t total, double elapsed_s) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
  out << fmt::format("\r{:>6}/{} [{}{}] {:3}% elapsed {:.1f}s", done, total,
                     std::string(filled, '#'), std::string(kWidth - filled, ' '),
                     100 * done / std::max<int64_t>(total, 1), elapsed_s)
      << std::flush;
}

}  // namespace

void ValidateBenchServeOptions(const BenchServeOptions& o) {
  ParseBaseUrl(o.base_url);
  AFD_CHECK(!o.endpoint.empty() && o.endpoint[0] == '/',
            "--endpoint \"{}\": must be a path starting with /", o.endpoint);
  AFD_CHECK(o.num_prompts >= 1, "--num-prompts {}: must be at least 1", o.num_prompts);
  AFD_CHECK(o.random_output_len >= 1, "--random-output-len {}: must be at least 1",
            o.random_output_len);
  AFD_CHECK(o.request_rate > 0 && !std::isnan(o.request_rate),
            "--request-rate {}: must be a positive number or inf", o.request_rate);
  AFD_CHECK(o.burstiness > 0 && !std::isnan(o.burstiness), "--burstiness {}: must be positive",
            o.burstiness);
  AFD_CHECK(o.max_concurrency >= 0, "--max-concurrency {}: must be positive", o.max_concurrency);
  AFD_CHECK(std::isfinite(o.request_timeout_s) && o.request_timeout_s > 0,
            "--request-timeout-s {}: must be a positive number of seconds", o.request_timeout_s);
  AFD_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "--temperature {}: must be >= 0",
            o.temperature);
  for (const double p : o.metric_percentiles) {
    AFD_CHECK(p >= 0 && p <= 100, "--metric-percentiles: {} is not in [0, 100]", p);
  }
  for (const std::string& m : o.percentile_metrics) {
    AFD_CHECK(m == "ttft" || m == "tpot" || m == "itl" || m == "e2el",
              "--percentile-metrics: \"{}\" is not one of ttft, tpot, itl, e2el", m);
  }
  if (!o.plot.empty()) {
    AFD_CHECK(o.plot.size() > 4 && o.plot.substr(o.plot.size() - 4) == ".png",
              "--plot {}: the file name must end in .png", o.plot);
  }
}

std::vector<double> ArrivalTimes(int64_t n, double request_rate, double burstiness, uint64_t seed) {
  std::vector<double> at(static_cast<size_t>(n), 0.0);
  if (std::isinf(request_rate) || n == 0) return at;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  double t = 0.0;
  for (double& a : at) {
    t += std::isinf(burstiness) ? 1.0 / request_rate : gap(rng);
    a = t;
  }
  if (at.back() > 0) {
    const double scale = static_cast<double>(n) / request_rate / at.back();
    for (double& a : at) a *= scale;
  }
  return at;
}

std::vector<BenchPrompt> LoadBenchPrompts(const BenchServeOptions& o) {
  ValidateBenchServeOptions(o);
  if (o.dataset == "random") {
    RandomDatasetOptions r;
    r.num_prompts = o.num_prompts;
    r.input_len = o.random_input_len;
    r.output_len = o.random_output_len;
    r.range_ratio = o.random_range_ratio;
    r.vocab_size = o.random_vocab_size;
    r.seed = o.seed;
    return RandomDataset(r);
  }
  return LoadJsonlDataset(o.dataset, o.num_prompts, o.random_output_len);
}

BenchServeRun RunBenchServe(const BenchServeOptions& o, const std::vector<BenchPrompt>& prompts,
                            std::ostream* progress) {
  ValidateBenchServeOptions(o);
  const HttpStreamClient client(o.base_url, o.request_timeout_s, o.api_key);
  BenchServeRun run;
  run.model_id = o.model;
  {
    // Any HTTP reply proves the server is there; vLLM and this runtime answer /v1/models.
    const HttpStreamClient probe(o.base_url, std::min(o.request_timeout_s, 30.0), o.api_key);
    const HttpReply reply = probe.Get("/v1/models");
    AFD_CHECK(reply.transport_error.empty(), "cannot reach the server at --base-url {}: {}",
              o.base_url, reply.transport_error);
    if (run.model_id.empty()) {
      const auto models = nlohmann::json::parse(reply.body, nullptr, false);
      const bool listed = reply.status == 200 && models.is_object() && models.contains("data") &&
                          models["data"].is_array() && !models["data"].empty() &&
                          models["data"][0].is_object() && models["data"][0].contains("id") &&
                          models["data"][0]["id"].is_string();
      AFD_CHECK(listed, "no --model given and {}/v1/models lists none (HTTP {}: {})", o.base_url,
                reply.status, reply.body.substr(0, 200));
      run.model_id = models["data"][0]["id"].get<std::string>();
    }
  }
  CompletionSettings settings;
  settings.model = run.model_id;
  settings.temperature = o.temperature;
  settings.ignore_eos = o.ignore_eos;
  const auto n = static_cast<int64_t>(prompts.size());
  const std::vector<double> arrivals = ArrivalTimes(n, o.request_rate, o.burstiness, o.seed);

  run.outcomes.resize(prompts.size());
  std::vector<double> arrived_at(prompts.size(), 0.0);
  struct Done {
    Mutex mu;
    std::condition_variable_any cv;
    int64_t count AFD_GUARDED_BY(mu) = 0;
  } done;
  ArrivalQueue queue;
  const Clock::time_point start = Clock::now();

  const int64_t num_senders =
      std::min(n, o.max_concurrency > 0 ? o.max_concurrency : kMaxSenderThreads);
  std::vector<std::thread> senders;
  for (int64_t s = 0; s < num_senders; ++s) {
    senders.emplace_back([&] {
      size_t i = 0;
      while (queue.Pop(i)) {
        const double sent_at = Since(start);
        RequestOutcome outcome;
        try {
          const std::string body = CompletionRequestBody(settings, prompts[i]);
          outcome = SendCompletion(client, o.endpoint, body, prompts[i]);
        } catch (const std::exception& e) {  // e.g. out of memory: this request failed
          outcome.error = fmt::format("client error: {}", e.what());
        }
        outcome.start_s = sent_at;
        outcome.queue_s = sent_at - arrived_at[i];
        run.outcomes[i] = std::move(outcome);
        {
          MutexLock lock(done.mu);
          ++done.count;
        }
        done.cv.notify_all();
      }
    });
  }
  std::thread progress_thread;
  if (progress != nullptr) {
    progress_thread = std::thread([&] {
      MutexLock lock(done.mu);
      while (true) {
        const int64_t now_done = done.count;
        lock.unlock();
        DrawProgress(*progress, now_done, n, Since(start));
        lock.lock();
        if (now_done == n) break;
        done.cv.wait_for(lock, std::chrono::milliseconds(200));
      }
      *progress << "\n" << std::flush;
    });
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    arrived_at[i] = Since(start);
    queue.Push(i);
  }
  queue.Close();
  for (std::thread& t : senders) t.join();
  run.duration_s = Since(start);
  if (progress_thread.joinable()) progress_thread.join();
  run.metrics = ComputeServeMetrics(run.outcomes, run.duration_s, o.metric_percentiles);
  run.date = LocalDate();
  return run;
}

}  // namespace afd::bench_client

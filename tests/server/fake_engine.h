// A test-only EngineClient that "generates" without a model, on its own thread, one token per
// running sequence per step: next = (last * 31 + 7) % vocab (greedy), plus a term from
// (seed, sampler_stream, position) when temperature > 0. It honours max_tokens, EOS (eos_at:
// the token at that position becomes EOS), stop_token_ids, ignore_eos, logprobs and
// prompt_logprobs (fixed numbers), aborts, a waiting queue (max_running, paused) and failures
// (a prompt holding fail_token ends with an error output). The HTTP layer is tested with it.
// Thread safety: every method may be called from any thread.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "afd/server/engine_client.h"

namespace afd::server::test {

class FakeEngine : public EngineClient {
 public:
  explicit FakeEngine(EngineModelInfo info,
                      std::chrono::microseconds step = std::chrono::microseconds(300))
      : info_(std::move(info)), step_(step), thread_([this] { Loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    thread_.join();
  }

  // The token after `last` at output position `pos` (what the engine emits, EOS aside).
  static int32_t NextToken(const runtime::RequestParams& p, int32_t last, int64_t pos,
                           int64_t vocab) {
    int64_t next = (static_cast<int64_t>(last) * 31 + 7) % vocab;
    if (p.sampling.temperature > 0) {
      next = (next + static_cast<int64_t>((p.sampling.seed * 1000003u +
                                           static_cast<uint64_t>(p.sampler_stream) * 7919u +
                                           static_cast<uint64_t>(pos)) %
                                          101u)) %
             vocab;
    }
    return static_cast<int32_t>(next);
  }
  // The greedy continuation of `prompt`, `n` tokens, without EOS or stop tokens.
  static std::vector<int32_t> Expected(const runtime::RequestParams& p, int64_t n, int64_t vocab) {
    std::vector<int32_t> out;
    int32_t last = p.prompt.back();
    for (int64_t i = 0; i < n; ++i) out.push_back(last = NextToken(p, last, i, vocab));
    return out;
  }

  const EngineModelInfo& model_info() const override { return info_; }
  void Submit(uint64_t id, runtime::RequestParams params, OutputCallback cb) override {
    // A token id outside the vocabulary is refused as the real engine refuses it (Engine::Check).
    for (int32_t t : params.prompt) {
      if (t < 0 || t >= info_.vocab_size) {
        cb(runtime::RequestOutput::Rejected(
            id, fmt::format("prompt token id {} is outside the vocabulary [0, {})", t,
                            info_.vocab_size)));
        return;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    submitted_.push_back(params);
    waiting_.push_back(Seq{id, std::move(params), std::move(cb)});
  }
  void Abort(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    abort_requests_.push_back(id);
  }
  EngineLoad Load() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineLoad load;
    load.total.num_running = static_cast<int64_t>(running_.size());
    load.total.num_waiting = static_cast<int64_t>(waiting_.size());
    load.total.kv_blocks_used = static_cast<int64_t>(running_.size());
    load.total.kv_blocks_total = 100;
    load.engines.push_back(load.total);
    load.connector = connector;
    return load;
  }
  bool Ready() const override { return ready; }
  std::string Failure() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  void SetFailure(const std::string& f) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = f;
  }
  // Ids that were aborted while live.
  std::vector<uint64_t> aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  std::vector<runtime::RequestParams> submitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  size_t num_live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return running_.size() + waiting_.size();
  }

  std::atomic<bool> ready{true};
  std::atomic<bool> paused{false};
  std::atomic<int64_t> max_running{1 << 30};
  std::atomic<int64_t> eos_at{-1};
  std::atomic<int32_t> fail_token{-1};
  ConnectorRoundTrips connector;  // set before serving

 private:
  struct Seq {
    uint64_t id;
    runtime::RequestParams params;
    OutputCallback cb;
    int64_t generated = 0;
    int32_t last = 0;
  };

  static runtime::TokenLogprobs Logprobs(int32_t id, int32_t k, int64_t vocab, float lp) {
    runtime::TokenLogprobs out;
    out.logprob = lp;
    for (int32_t j = 0; j < k; ++j) {
      out.top.push_back({static_cast<int32_t>((id + j) % vocab), -0.5f - static_cast<float>(j)});
    }
    return out;
  }

  void Loop() {
    for (;;) {
      std::vector<std::pair<OutputCallback, runtime::RequestOutput>> deliveries;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (quit_) return;
        for (uint64_t id : abort_requests_) {
          for (auto* q : {&waiting_, &running_}) {
            for (auto it = q->begin(); it != q->end(); ++it) {
              if (it->id != id) continue;
              runtime::RequestOutput out;
              out.request_id = id;
              out.finished = true;
              out.finish_reason = runtime::FinishReason::kAbort;
              deliveries.emplace_back(it->cb, out);
              aborted_.push_back(id);
              q->erase(it);
              break;
            }
          }
        }
        abort_requests_.clear();
        if (!paused) {
          while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < max_running) {
            running_.push_back(std::move(waiting_.front()));
            waiting_.pop_front();
          }
          for (auto it = running_.begin(); it != running_.end();) {
            runtime::RequestOutput out = Step(*it);
            deliveries.emplace_back(it->cb, out);
            it = out.finished ? running_.erase(it) : it + 1;
          }
        }
      }
      for (auto& [cb, out] : deliveries) cb(out);
      std::this_thread::sleep_for(step_);
    }
  }

  runtime::RequestOutput Step(Seq& s) {
    const runtime::RequestParams& p = s.params;
    const int64_t vocab = info_.vocab_size;
    runtime::RequestOutput out;
    out.request_id = s.id;
    out.num_prompt_tokens = static_cast<int64_t>(p.prompt.size());
    for (int32_t t : p.prompt) {
      if (t == fail_token) {
        out.finished = true;
        out.finish_reason = runtime::FinishReason::kError;
        out.error = "injected failure";
        return out;
      }
    }
    if (s.generated == 0) {
      s.last = p.prompt.back();
      if (p.prompt_logprobs >= 0) {
        runtime::TokenLogprobs first;
        first.logprob = std::numeric_limits<float>::quiet_NaN();
        out.prompt_logprobs.push_back(first);
        for (size_t i = 1; i < p.prompt.size(); ++i) {
          out.prompt_logprobs.push_back(Logprobs(p.prompt[i], p.prompt_logprobs, vocab, -2.0f));
        }
      }
    }
    int32_t id = NextToken(p, s.last, s.generated, vocab);
    if (eos_at >= 0 && s.generated == eos_at && !info_.eos_token_ids.empty()) {
      id = info_.eos_token_ids[0];
    }
    s.last = id;
    ++s.generated;
    out.token_ids.push_back(id);
    if (p.logprobs >= 0) out.logprobs.push_back(Logprobs(id, p.logprobs, vocab, -1.0f));
    const bool eos =
        !p.ignore_eos && std::find(info_.eos_token_ids.begin(), info_.eos_token_ids.end(), id) !=
                             info_.eos_token_ids.end();
    const bool stop =
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) != p.stop_token_ids.end();
    if (eos || stop) {
      out.finished = true;
      out.finish_reason = runtime::FinishReason::kStop;
      out.stop_token_id = id;
    } else if (s.generated >= p.max_tokens) {
      out.finished = true;
      out.finish_reason = runtime::FinishReason::kLength;
    }
    return out;
  }

  EngineModelInfo info_;
  std::chrono::microseconds step_;
  mutable std::mutex mu_;
  bool quit_ = false;
  std::deque<Seq> waiting_;
  std::deque<Seq> running_;
  std::vector<uint64_t> abort_requests_;
  std::vector<uint64_t> aborted_;
  std::vector<runtime::RequestParams> submitted_;
  std::string failure_;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace afd::server::test

#include "afd/server/local_engine_client.h"

#include <chrono>
#include <vector>

#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"

namespace afd::server {

LocalEngineClient::LocalEngineClient(const model::MoeModel& model, runtime::StepRunner& runner,
                                     const runtime::EngineOptions& options)
    : model_(model), engine_(model, runner, options) {
  const model::ModelConfig& c = model.config();
  info_.vocab_size = c.vocab_size;
  info_.max_model_len = engine_.max_model_len();
  for (int64_t id : c.eos_token_ids) info_.eos_token_ids.push_back(static_cast<int32_t>(id));
  stats_ = engine_.stats();
  thread_ = std::thread([this] { Loop(); });
}

LocalEngineClient::~LocalEngineClient() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  FailAll("the engine stopped");
}

void LocalEngineClient::Submit(uint64_t id, runtime::RequestParams params,
                               OutputCallback on_output) {
  std::string refused;
  {
    MutexLock lock(mu_);
    if (!failure_.empty() || stop_) {
      refused = failure_.empty() ? "the engine stopped" : failure_;
    } else {
      AFD_CHECK(!callbacks_.count(id), "request id {} is already live", id);
      callbacks_[id] = std::move(on_output);
      inbox_.push_back({id, false, std::move(params)});
    }
  }
  if (!refused.empty()) {
    on_output(runtime::RequestOutput::Failed(id, refused));
    return;
  }
  wake_.notify_all();
}

void LocalEngineClient::Abort(uint64_t id) {
  {
    MutexLock lock(mu_);
    if (!callbacks_.count(id)) return;
    inbox_.push_back({id, true, {}});
  }
  wake_.notify_all();
}

EngineLoad LocalEngineClient::Load() const {
  MutexLock lock(mu_);
  EngineLoad load;
  load.total = stats_;
  // Submitted but not yet seen by the engine: waiting too.
  for (const Inbound& in : inbox_) load.total.num_waiting += in.abort ? 0 : 1;
  load.engines = {load.total};
  load.step_seconds = step_seconds_;
  load.delivery_seconds = delivery_seconds_;
  return load;
}

std::string LocalEngineClient::Failure() const {
  MutexLock lock(mu_);
  return failure_;
}

void LocalEngineClient::FailAll(const std::string& why) {
  std::map<uint64_t, OutputCallback> live;
  {
    MutexLock lock(mu_);
    live.swap(callbacks_);
    inbox_.clear();
  }
  for (auto& [id, callback] : live) callback(runtime::RequestOutput::Failed(id, why));
}

void LocalEngineClient::Loop() {
  model_.backend().BindThread();
  while (true) {
    std::deque<Inbound> inbox;
    {
      MutexLock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !inbox_.empty() || engine_.HasWork(); });
      if (stop_) return;
      inbox.swap(inbox_);
    }
    std::vector<runtime::RequestOutput> outputs;
    try {
      for (Inbound& in : inbox) {
        if (in.abort) {
          engine_.Abort(in.id);
        } else {
          engine_.Add(in.id, std::move(in.params));
        }
      }
      const auto step_start = std::chrono::steady_clock::now();
      outputs = engine_.Step();
      const double step =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      MutexLock lock(mu_);
      step_seconds_ += step;
    } catch (const std::exception& e) {
      {
        MutexLock lock(mu_);
        failure_ = fmt::format("the engine failed: {}", e.what());
      }
      FailAll(Failure());
      return;
    }
    const runtime::EngineStats stats = engine_.stats();
    {
      MutexLock lock(mu_);
      stats_ = stats;
    }
    // Callbacks run without the lock (they may Submit or Abort); a finished request's
    // callback leaves the map first, so an Abort racing with it is ignored.
    const auto delivery_start = std::chrono::steady_clock::now();
    for (const runtime::RequestOutput& o : outputs) {
      OutputCallback callback;
      {
        MutexLock lock(mu_);
        const auto it = callbacks_.find(o.request_id);
        if (it == callbacks_.end()) continue;
        if (o.finished) {
          callback = std::move(it->second);
          callbacks_.erase(it);
        } else {
          callback = it->second;
        }
      }
      callback(o);
    }
    const double delivery =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - delivery_start).count();
    MutexLock lock(mu_);
    delivery_seconds_ += delivery;
  }
}

}  // namespace afd::server

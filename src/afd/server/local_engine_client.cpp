#include "afd/server/local_engine_client.h"

#include <chrono>
#include <future>
#include <vector>

#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"
#include "afd/pd/kv_transport.h"

namespace afd::server {

LocalEngineClient::LocalEngineClient(const model::MoeModel& model, runtime::StepRunner& runner,
                                     const runtime::EngineOptions& options)
    : model_(model), engine_(model, runner, options) {
  const model::ModelConfig& c = model.config();
  info_.vocab_size = c.vocab_size;
  info_.max_model_len = engine_.max_model_len();
  for (int64_t id : c.eos_token_ids) info_.eos_token_ids.push_back(static_cast<int32_t>(id));
  stats_ = engine_.stats();
  kv_layout_ = {pd::KvModelFingerprint(model), c.num_hidden_layers, engine_.kv_row_width(),
                engine_.kv_dtype()};
  thread_ = std::thread([this] { Loop(); });
}

std::shared_ptr<const runtime::KvRows> LocalEngineClient::ExportHeldKv(uint64_t id,
                                                                       double timeout_s,
                                                                       bool device_ok) {
  // Staged rows at once, from this thread; rows left in the cache's blocks on the engine's.
  if (std::shared_ptr<const runtime::KvRows> staged = engine_.staged_kv().Find(id)) return staged;
  auto result = std::make_shared<std::promise<std::shared_ptr<const runtime::KvRows>>>();
  std::future<std::shared_ptr<const runtime::KvRows>> done = result->get_future();
  {
    MutexLock lock(mu_);
    AFD_CHECK(failure_.empty() && !stop_, "request {}: no KV rows to export: {}", id,
              failure_.empty() ? "the engine stopped" : failure_);
    tasks_.push_back([this, id, result, device_ok] {
      try {
        result->set_value(engine_.ExportHeldKv(id, device_ok));
      } catch (...) {
        result->set_exception(std::current_exception());
      }
    });
  }
  wake_.notify_all();
  AFD_CHECK(done.wait_for(std::chrono::duration<double>(timeout_s)) == std::future_status::ready,
            "request {}: the engine did not export its KV rows within {} s", id, timeout_s);
  return done.get();
}

void LocalEngineClient::ReleaseHeldKv(uint64_t id) {
  // Staged rows are freed here at once (thread-safe); the engine's thread then frees rows left in
  // its blocks, and its load report (kv_held) follows either way.
  engine_.staged_kv().Erase(id);
  {
    MutexLock lock(mu_);
    if (stop_) return;
    tasks_.push_back([this, id] { engine_.ReleaseHeldKv(id); });
  }
  wake_.notify_all();
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
    std::deque<std::function<void()>> tasks;
    {
      MutexLock lock(mu_);
      const auto ready = [&] {
        return stop_ || !inbox_.empty() || !tasks_.empty() || engine_.HasWork();
      };
      if (stats_.kv_held > 0) {
        // Held KV rows expire in Engine::Step: wake for it now and then while idle.
        wake_.wait_for(lock, std::chrono::seconds(1), ready);
      } else {
        wake_.wait(lock, ready);
      }
      if (stop_) return;
      inbox.swap(inbox_);
      tasks.swap(tasks_);
    }
    std::vector<runtime::RequestOutput> outputs;
    try {
      for (std::function<void()>& task : tasks) task();
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

// An EngineClient over one runtime::Engine in this process (a monolithic `afd serve`, and the
// tests of the HTTP layer): the engine runs on its own thread, which takes submitted requests
// and aborts from a queue before every step, steps while there is work, and calls each
// request's callback with its outputs. A step that throws (a backend failure) ends every live
// request with an error output and makes Failure() say why; the thread then refuses new work.
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "afd/common/thread_annotations.h"
#include "afd/runtime/engine.h"
#include "afd/server/engine_client.h"

namespace afd::server {

class LocalEngineClient : public EngineClient {
 public:
  // `model` and `runner` must outlive the client. Starts the engine thread. Throws
  // afd::Error for bad options.
  LocalEngineClient(const model::MoeModel& model, runtime::StepRunner& runner,
                    const runtime::EngineOptions& options);
  // Stops the thread; requests still live get an error output ("the engine stopped").
  ~LocalEngineClient() override;

  const EngineModelInfo& model_info() const override { return info_; }
  void Submit(uint64_t id, runtime::RequestParams params, OutputCallback on_output) override;
  void Abort(uint64_t id) override;
  EngineLoad Load() const override;
  bool Ready() const override { return Failure().empty(); }
  std::string Failure() const override;
  bool SupportsKvTransfer() const override { return true; }
  std::shared_ptr<const runtime::KvRows> ExportHeldKv(uint64_t id, double timeout_s,
                                                      bool device_ok = false) override;
  void ReleaseHeldKv(uint64_t id) override;
  runtime::KvLayout kv_cache_layout() const override { return kv_layout_; }

 private:
  struct Inbound {
    uint64_t id = 0;
    bool abort = false;
    runtime::RequestParams params;
  };
  void Loop();
  // Ends every live request with an error output (callbacks called without the lock held).
  void FailAll(const std::string& why);

  const model::MoeModel& model_;
  EngineModelInfo info_;
  // Used by the engine thread only (after construction), but for its thread-safe staged_kv().
  runtime::Engine engine_;
  mutable Mutex mu_;
  std::condition_variable_any wake_;
  std::deque<Inbound> inbox_;
  // Work for the engine's thread besides requests (KV exports and releases), run before them.
  std::deque<std::function<void()>> tasks_;
  runtime::KvLayout kv_layout_;
  std::map<uint64_t, OutputCallback> callbacks_;
  runtime::EngineStats stats_;
  double step_seconds_ AFD_GUARDED_BY(mu_) = 0, delivery_seconds_ = 0;  // (EngineLoad)
  std::string failure_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace afd::server

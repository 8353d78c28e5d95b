// One accepted generation request in the engines: submits its sequences (one per choice),
// collects their outputs from the engine threads, and hands the handler thread one ChoiceDelta
// at a time. Whatever happens, each sequence is aborted in the engine unless it finished: when a
// stop string ends it, when the client is gone (Abort), and in the destructor.
//
// Every wait is bounded: NextDelta returns after `timeout`; when EngineClient::Failure() is set
// and no output came for kFailureGraceMs, the remaining choices fail with that reason.
//
// Thread safety: Submit/NextDelta/Abort/choices belong to one thread at a time (the handler,
// then the connection's strand); the engine's callbacks run on engine threads and only touch
// the shared queue (and call the notify function).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "afd/server/api/choice_state.h"
#include "afd/server/api/server_context.h"

namespace afd::server::api {

class RequestRun {
 public:
  static constexpr int kFailureGraceMs = 2000;

  RequestRun(std::shared_ptr<ServerContext> ctx, const SamplingRequest& request);
  ~RequestRun();
  RequestRun(const RequestRun&) = delete;
  RequestRun& operator=(const RequestRun&) = delete;

  // Submits one sequence; its choice index is the number submitted before it.
  void Submit(runtime::RequestParams params);

  // The next delta of some choice, or nullopt when none came within `timeout` or all are done.
  // A choice that fails yields no delta: check choice(i).error() once done().
  std::optional<std::pair<size_t, ChoiceDelta>> NextDelta(std::chrono::milliseconds timeout);

  bool done() const;
  // The first failed choice's error, or "".
  std::string error() const;
  // That choice was refused for the request's own input (a 400, not a 500).
  bool rejected() const;
  // Ends every unfinished choice: the client is gone ("abort" in the metrics).
  void Abort();
  // Called (on an engine thread, after the output is queued, with no lock held) whenever an
  // output arrives, so that an event loop can pump NextDelta(0) instead of waiting in it; null:
  // none. May be set at any time.
  void SetNotify(std::function<void()> notify);

  size_t num_choices() const { return choices_.size(); }
  // The engine's id of choice i's sequence.
  uint64_t sequence_id(size_t i) const;
  const ChoiceState& choice(size_t i) const { return choices_[i]; }
  const std::vector<int32_t>& prompt(size_t i) const { return prompts_[i]; }

 private:
  struct Shared;
  void AbortSequence(size_t choice, const char* metrics_reason);

  std::shared_ptr<ServerContext> ctx_;
  SamplingRequest request_;
  std::shared_ptr<Shared> shared_;
  std::vector<ChoiceState> choices_;
  std::vector<std::vector<int32_t>> prompts_;
  std::chrono::steady_clock::time_point last_output_;
};

}  // namespace afd::server::api

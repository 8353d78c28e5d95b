#include "afd/server/api/request_run.h"

#include "afd/common/thread_annotations.h"

namespace afd::server::api {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
// The finished_reason label (runtime::FinishReasonName lives in the engine's library).
const char* ReasonLabel(runtime::FinishReason r) {
  switch (r) {
    case runtime::FinishReason::kStop:
      return "stop";
    case runtime::FinishReason::kLength:
      return "length";
    case runtime::FinishReason::kAbort:
      return "abort";
    default:
      return "error";
  }
}
}  // namespace

// Shared with the engine callbacks, which may outlive the RequestRun (the final output of an
// aborted sequence comes later).
struct RequestRun::Shared {
  struct Sequence {
    uint64_t id = 0;
    bool got_tokens = false;
    bool finished = false;
    Clock::time_point last;
    std::string metrics_reason;  // set when the server ended it (stop string, client gone)
    int64_t prompt_tokens = 0;   // of its prompt
    int64_t generated = 0;       // tokens output so far
  };
  Clock::time_point arrival = Clock::now();
  Mutex mu;
  std::condition_variable_any cv;
  std::deque<std::pair<size_t, runtime::RequestOutput>> outputs AFD_GUARDED_BY(mu);
  std::vector<Sequence> sequences AFD_GUARDED_BY(mu);
  std::function<void()> notify AFD_GUARDED_BY(mu);
};

RequestRun::RequestRun(std::shared_ptr<ServerContext> ctx, const SamplingRequest& request)
    : ctx_(std::move(ctx)),
      request_(request),
      shared_(std::make_shared<Shared>()),
      last_output_(Clock::now()) {}

RequestRun::~RequestRun() {
  for (size_t i = 0; i < choices_.size(); ++i) AbortSequence(i, "abort");
}

void RequestRun::Submit(runtime::RequestParams params) {
  const size_t choice = choices_.size();
  choices_.emplace_back(ctx_->tokenizer(), request_, ctx_->engine().model_info());
  prompts_.push_back(params.prompt);
  const uint64_t id = ctx_->RegisterSequence();
  {
    MutexLock lock(shared_->mu);
    Shared::Sequence seq;
    seq.id = id;
    seq.last = Clock::now();
    seq.prompt_tokens = static_cast<int64_t>(params.prompt.size());
    shared_->sequences.push_back(std::move(seq));
  }
  std::shared_ptr<ServerContext> ctx = ctx_;
  std::shared_ptr<Shared> shared = shared_;
  ctx_->engine().Submit(
      id, std::move(params), [ctx, shared, choice](const runtime::RequestOutput& out) {
        const Clock::time_point now = Clock::now();
        MutexLock lock(shared->mu);
        Shared::Sequence& seq = shared->sequences[choice];
        if (seq.finished) return;
        const auto num_tokens = static_cast<int64_t>(out.token_ids.size());
        seq.generated += num_tokens;
        if (num_tokens > 0 && !seq.got_tokens) {
          seq.got_tokens = true;
          ctx->metrics().OnFirstOutput(Seconds(now - shared->arrival), out.num_prompt_tokens,
                                       num_tokens);
        } else if (num_tokens > 0) {
          ctx->metrics().OnNextOutput(Seconds(now - seq.last), num_tokens);
        }
        seq.last = now;
        if (out.finished) {
          seq.finished = true;
          ctx->SequenceFinished(seq.id);
          ctx->metrics().OnFinished(
              seq.metrics_reason.empty() ? ReasonLabel(out.finish_reason) : seq.metrics_reason,
              Seconds(now - shared->arrival), seq.prompt_tokens, seq.generated);
        }
        shared->outputs.emplace_back(choice, out);
        shared->cv.notify_all();
        const std::function<void()> notify = shared->notify;
        lock.unlock();
        if (notify) notify();
      });
}

uint64_t RequestRun::sequence_id(size_t i) const {
  MutexLock lock(shared_->mu);
  return shared_->sequences.at(i).id;
}

void RequestRun::SetNotify(std::function<void()> notify) {
  MutexLock lock(shared_->mu);
  shared_->notify = std::move(notify);
}

void RequestRun::AbortSequence(size_t choice, const char* metrics_reason) {
  uint64_t id;
  {
    MutexLock lock(shared_->mu);
    Shared::Sequence& seq = shared_->sequences[choice];
    if (seq.finished) return;
    if (seq.metrics_reason.empty()) seq.metrics_reason = metrics_reason;
    id = seq.id;
  }
  ctx_->engine().Abort(id);
}

bool RequestRun::done() const {
  for (const auto& c : choices_) {
    if (!c.done()) return false;
  }
  return true;
}

std::string RequestRun::error() const {
  for (const auto& c : choices_) {
    if (!c.error().empty()) return c.error();
  }
  return "";
}

bool RequestRun::rejected() const {
  for (const auto& c : choices_) {
    if (!c.error().empty()) return c.rejected();
  }
  return false;
}

void RequestRun::Abort() {
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (!choices_[i].done()) choices_[i].Fail("the client disconnected");
    AbortSequence(i, "abort");
  }
}

std::optional<std::pair<size_t, ChoiceDelta>> RequestRun::NextDelta(
    std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!done()) {
    std::pair<size_t, runtime::RequestOutput> next;
    {
      MutexLock lock(shared_->mu);
      while (shared_->outputs.empty() &&
             shared_->cv.wait_until(lock, deadline) != std::cv_status::timeout) {
      }
      if (shared_->outputs.empty()) {
        lock.unlock();
        // No output: give up on the engines only when they report a failure.
        const std::string failure = ctx_->engine().Failure();
        if (!failure.empty() &&
            Clock::now() - last_output_ > std::chrono::milliseconds(kFailureGraceMs)) {
          for (size_t i = 0; i < choices_.size(); ++i) {
            choices_[i].Fail("the engine failed: " + failure);
            AbortSequence(i, "error");
          }
        }
        return std::nullopt;
      }
      next = std::move(shared_->outputs.front());
      shared_->outputs.pop_front();
    }
    last_output_ = Clock::now();
    ChoiceState& choice = choices_[next.first];
    std::optional<ChoiceDelta> delta = choice.Apply(next.second);
    if (choice.needs_abort()) AbortSequence(next.first, "stop");
    if (delta) return std::make_pair(next.first, std::move(*delta));
  }
  return std::nullopt;
}

}  // namespace afd::server::api

#include "afd/runtime/scheduler.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::runtime {

Scheduler::Scheduler(SchedulerLimits limits, kv::PagedKvCache& cache)
    : limits_(limits), cache_(cache) {
  AFD_CHECK(limits.max_num_seqs >= 0, "max_num_seqs must be >= 0, got {}", limits.max_num_seqs);
  AFD_CHECK(limits.max_num_batched_tokens >= 0, "max_num_batched_tokens must be >= 0, got {}",
            limits.max_num_batched_tokens);
}

void Scheduler::Add(int64_t request, std::vector<int32_t> prompt, bool prompt_logprobs) {
  AFD_CHECK(!prompt.empty(), "request {}: empty prompt", request);
  const int64_t blocks = cache_.shape().BlocksFor(static_cast<int64_t>(prompt.size()) + 1);
  AFD_CHECK(blocks <= cache_.shape().num_blocks,
            "request {}: a prompt of {} tokens needs {} KV cache blocks, the cache has {}", request,
            prompt.size(), blocks, cache_.shape().num_blocks);
  Seq s;
  s.request = request;
  s.prompt_len = static_cast<int64_t>(prompt.size());
  s.tokens = std::move(prompt);
  s.prompt_logprobs = prompt_logprobs;
  waiting_.push_back(std::move(s));
}

Scheduler::Seq* Scheduler::Find(int64_t request) {
  for (Seq& s : running_) {
    if (s.request == request) return &s;
  }
  for (Seq& s : waiting_) {
    if (s.request == request) return &s;
  }
  return nullptr;
}

void Scheduler::Abort(int64_t request) {
  for (size_t i = 0; i < running_.size(); ++i) {
    if (running_[i].request != request) continue;
    cache_.Release(running_[i].cache_seq);
    running_.erase(running_.begin() + i);
    return;
  }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [request](const Seq& s) { return s.request == request; }),
                 waiting_.end());
}

void Scheduler::Preempt(size_t i) {
  Seq s = std::move(running_[i]);
  running_.erase(running_.begin() + i);
  cache_.Release(s.cache_seq);
  s.cache_seq = -1;
  waiting_.push_front(std::move(s));
  ++preemptions_;
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  using Logits = model::ForwardBatch::Logits;
  // Decode: one token per running sequence; free blocks by preempting the newest if needed.
  for (size_t i = 0; i < running_.size();) {
    Seq& s = running_[i];
    const int64_t pos = cache_.length(s.cache_seq);  // the last token's position
    if (!cache_.Reserve(s.cache_seq, pos + 1)) {
      // The newest running sequence gives its blocks back (possibly this one).
      const size_t victim = running_.size() - 1;
      Preempt(victim);
      if (victim == i) break;
      continue;
    }
    ++i;
  }
  for (const Seq& s : running_) {
    ScheduledSeq e;
    e.request = s.request;
    e.first_row = plan.batch.size();
    e.num_tokens = 1;
    e.first_logits_row = static_cast<int64_t>(plan.batch.logits_rows.size());
    e.num_logits_rows = 1;
    plan.batch.Add(cache_, s.cache_seq, {s.tokens.back()}, cache_.length(s.cache_seq),
                   Logits::kLast);
    plan.seqs.push_back(e);
    ++plan.num_decode_tokens;
  }
  // Admit waiting sequences while there is room.
  const size_t max_seqs =
      limits_.max_num_seqs > 0 ? static_cast<size_t>(limits_.max_num_seqs) : SIZE_MAX;
  while (!waiting_.empty() && running_.size() < max_seqs) {
    Seq& s = waiting_.front();
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    if (limits_.max_num_batched_tokens > 0 && plan.batch.size() > 0 &&
        plan.batch.size() + len > limits_.max_num_batched_tokens) {
      break;  // waits for a step with room
    }
    const int64_t seq = cache_.AddSequence();
    // Room for the tokens plus the next one, so that the first decode rarely preempts.
    if (!cache_.Reserve(seq, len + 1) && !cache_.Reserve(seq, len)) {
      cache_.Release(seq);
      AFD_CHECK(!running_.empty() || plan.batch.size() > 0,
                "request {}: {} tokens do not fit in the free KV cache blocks ({} free)", s.request,
                len, cache_.num_free_blocks());
      break;
    }
    s.cache_seq = seq;
    ScheduledSeq e;
    e.request = s.request;
    e.prefill = true;
    e.first_prefill = !s.prefilled;
    e.first_row = plan.batch.size();
    e.num_tokens = len;
    e.first_logits_row = static_cast<int64_t>(plan.batch.logits_rows.size());
    const bool all = e.first_prefill && s.prompt_logprobs;
    e.num_logits_rows = all ? len : 1;
    plan.batch.Add(cache_, seq, s.tokens, 0, all ? Logits::kAll : Logits::kLast);
    plan.seqs.push_back(e);
    plan.num_prefill_tokens += len;
    running_.push_back(std::move(s));
    waiting_.pop_front();
  }
  return plan;
}

void Scheduler::Update(const StepPlan& plan, const std::vector<int32_t>& next_ids,
                       const std::vector<char>& finished) {
  AFD_CHECK(next_ids.size() == plan.seqs.size() && finished.size() == plan.seqs.size(),
            "scheduler: {} ids and {} flags for {} sequences", next_ids.size(), finished.size(),
            plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Seq* s = Find(plan.seqs[i].request);
    AFD_CHECK(s != nullptr && s->cache_seq >= 0, "scheduler: request {} is not running",
              plan.seqs[i].request);
    s->prefilled = true;
    if (finished[i]) {
      Abort(s->request);
      continue;
    }
    s->tokens.push_back(next_ids[i]);
  }
}

}  // namespace afd::runtime

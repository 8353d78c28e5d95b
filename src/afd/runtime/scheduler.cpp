#include "afd/runtime/scheduler.h"

#include <algorithm>
#include <cstdint>

#include "afd/common/error.h"

namespace afd::runtime {

Scheduler::Scheduler(SchedulerLimits limits, kv::PagedKvCache& cache)
    : limits_(limits), cache_(cache) {
  AFD_CHECK(!limits.chunked_prefill || limits.max_num_batched_tokens > 0,
            "chunked prefill needs max_num_batched_tokens > 0");
  AFD_CHECK(limits.max_num_seqs >= 0, "max_num_seqs must be >= 0, got {}", limits.max_num_seqs);
  AFD_CHECK(limits.max_num_batched_tokens >= 0, "max_num_batched_tokens must be >= 0, got {}",
            limits.max_num_batched_tokens);
}

void Scheduler::Add(int64_t request, std::vector<int32_t> prompt, bool prompt_logprobs,
                    int64_t cached, bool hold) {
  AFD_CHECK(!prompt.empty(), "request {}: empty prompt", request);
  AFD_CHECK(cached >= 0 && cached < static_cast<int64_t>(prompt.size()),
            "request {}: {} imported positions of a {}-token prompt (at least its last token is "
            "computed here)",
            request, cached, prompt.size());
  AFD_CHECK(cached == 0 || import_, "request {}: imported positions without an import hook",
            request);
  const int64_t blocks = cache_.shape().BlocksFor(static_cast<int64_t>(prompt.size()) + 1);
  AFD_CHECK(blocks <= cache_.shape().num_blocks,
            "request {}: a prompt of {} tokens needs {} KV cache blocks, the cache has {}", request,
            prompt.size(), blocks, cache_.shape().num_blocks);
  Seq s;
  s.request = request;
  s.prompt_len = static_cast<int64_t>(prompt.size());
  s.tokens = std::move(prompt);
  s.prompt_logprobs = prompt_logprobs;
  s.cached = cached;
  s.hold = hold;
  waiting_.push_back(std::move(s));
}

std::optional<Scheduler::HeldCache> Scheduler::TakeHeld(int64_t request) {
  const auto it = held_.find(request);
  if (it == held_.end()) return std::nullopt;
  const HeldCache h = it->second;
  held_.erase(it);
  return h;
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
  s.computed = 0;
  s.cached = 0;  // the imported rows went with the blocks: recompute everything
  waiting_.push_front(std::move(s));
  ++preemptions_;
}

void Scheduler::Plan(Seq& s, int64_t count, StepPlan& plan) {
  using Logits = model::ForwardBatch::Logits;
  const int64_t total = static_cast<int64_t>(s.tokens.size());
  ScheduledSeq e;
  e.request = s.request;
  e.prefill = s.computed == 0 || total - s.computed > 1;
  e.first_prefill = !s.prefilled;
  e.sample = s.computed + count == total;
  e.first_row = plan.batch.size();
  e.start = s.computed;
  e.num_tokens = count;
  e.first_logits_row = static_cast<int64_t>(plan.batch.logits_rows.size());
  const bool all = e.prefill && e.first_prefill && s.prompt_logprobs;
  e.num_logits_rows = all ? count : (e.sample ? 1 : 0);
  const std::span<const int32_t> ids(s.tokens.data() + s.computed, static_cast<size_t>(count));
  plan.batch.AddNew(cache_, s.cache_seq, ids, s.computed,
                    all ? Logits::kAll : (e.sample ? Logits::kLast : Logits::kNone));
  plan.seqs.push_back(e);
  if (e.prefill) {
    plan.num_prefill_tokens += count;
  } else {
    ++plan.num_decode_tokens;
  }
  s.computed += count;
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  plan.batch.Reserve(static_cast<int64_t>(running_.size()) + 1,
                     static_cast<int64_t>(running_.size() + waiting_.size()));
  const int64_t budget =
      limits_.max_num_batched_tokens > 0 ? limits_.max_num_batched_tokens : INT64_MAX;
  auto left = [&] { return budget - plan.batch.size(); };
  // Running sequences in admission order: a decode token each, or the next chunk of a prompt
  // (only with room left in the step). When the tokens need a block and none is free, the
  // newest running sequence (possibly this one; never one planned already) gives its blocks
  // back.
  for (size_t i = 0; i < running_.size();) {
    Seq& s = running_[i];
    AFD_CHECK(!s.id_pending, "scheduler: request {} still waits for the id of a step ahead",
              s.request);
    const int64_t todo = static_cast<int64_t>(s.tokens.size()) - s.computed;
    const int64_t count = todo == 1 ? 1 : std::min(todo, left());
    if (count <= 0) {
      ++i;
      continue;
    }
    if (!cache_.Reserve(s.cache_seq, s.computed + count)) {
      const size_t victim = running_.size() - 1;
      Preempt(victim);
      if (victim == i) break;
      continue;
    }
    Plan(s, count, plan);
    ++i;
  }
  // Admit waiting sequences while there is room.
  const size_t max_seqs =
      limits_.max_num_seqs > 0 ? static_cast<size_t>(limits_.max_num_seqs) : SIZE_MAX;
  while (!waiting_.empty() && running_.size() < max_seqs) {
    Seq& s = waiting_.front();
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    // Imported positions need their blocks now, with the tokens computed here.
    const int64_t todo = len - s.cached;
    int64_t count = todo;
    if (limits_.chunked_prefill) {
      count = std::min(todo, left());
      if (count <= 0) break;
    } else if (plan.batch.size() > 0 && todo > left()) {
      break;  // waits for a step with room
    }
    const int64_t seq = cache_.AddSequence();
    // Room for the tokens plus the next one, so that the first decode rarely preempts.
    if (!(count == todo && cache_.Reserve(seq, len + 1)) &&
        !cache_.Reserve(seq, s.cached + count)) {
      cache_.Release(seq);
      AFD_CHECK(!running_.empty() || plan.batch.size() > 0,
                "request {}: {} tokens do not fit in the free KV cache blocks ({} free)", s.request,
                s.cached + count, cache_.num_free_blocks());
      break;
    }
    if (s.cached > 0) import_(s.request, seq, s.cached);
    s.cache_seq = seq;
    s.computed = s.cached;
    running_.push_back(std::move(s));
    waiting_.pop_front();
    Plan(running_.back(), count, plan);
  }
  return plan;
}

std::optional<StepPlan> Scheduler::ScheduleAhead(const StepPlan& inflight,
                                                 const std::vector<char>& finishing) {
  AFD_CHECK(finishing.size() == inflight.seqs.size(),
            "scheduler: {} finishing flags for {} sequences", finishing.size(),
            inflight.seqs.size());
  // Waiting requests join only in a step planned after the results (Schedule): none may wait,
  // unless none could join anyway (max_num_seqs running; one that ends with inflight frees its
  // place for the step after next, as a stop token found late does).
  const bool full =
      limits_.max_num_seqs > 0 && static_cast<int64_t>(running_.size()) >= limits_.max_num_seqs;
  if ((!waiting_.empty() && !full) || running_.empty()) return std::nullopt;
  // Each running sequence's entry in inflight: the same order (entries of sequences aborted
  // since are passed over).
  std::vector<size_t> entry(running_.size());
  int64_t planned = 0;
  for (size_t i = 0, cursor = 0; i < running_.size(); ++i, ++cursor) {
    const Seq& s = running_[i];
    while (cursor < inflight.seqs.size() && inflight.seqs[cursor].request != s.request) ++cursor;
    if (cursor == inflight.seqs.size()) return std::nullopt;  // not in that step
    if (!inflight.seqs[cursor].sample || s.id_pending ||
        s.computed != static_cast<int64_t>(s.tokens.size())) {
      return std::nullopt;  // a prompt chunk still to run, or not caught up
    }
    entry[i] = cursor;
    if (!finishing[cursor]) ++planned;
  }
  const int64_t budget =
      limits_.max_num_batched_tokens > 0 ? limits_.max_num_batched_tokens : INT64_MAX;
  if (planned == 0 || planned > budget) return std::nullopt;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Seq& s = running_[i];
    if (!finishing[entry[i]] && !cache_.Reserve(s.cache_seq, s.computed + 1)) return std::nullopt;
  }
  StepPlan plan;
  plan.batch.Reserve(planned, planned);
  plan.batch.id_source.reserve(planned);
  for (size_t i = 0; i < running_.size(); ++i) {
    if (finishing[entry[i]]) continue;
    Seq& s = running_[i];
    s.tokens.push_back(0);  // the placeholder; Update puts the id in
    s.id_pending = true;
    s.prefilled = true;  // it samples in inflight (Update would say so before a Schedule)
    Plan(s, 1, plan);
    const ScheduledSeq& e = inflight.seqs[entry[i]];
    plan.batch.id_source.push_back(
        static_cast<int32_t>(e.first_logits_row + e.num_logits_rows - 1));
  }
  return plan;
}

void Scheduler::Update(const StepPlan& plan, const std::vector<int32_t>& next_ids,
                       const std::vector<char>& finished) {
  AFD_CHECK(next_ids.size() == plan.seqs.size() && finished.size() == plan.seqs.size(),
            "scheduler: {} ids and {} flags for {} sequences", next_ids.size(), finished.size(),
            plan.seqs.size());
  // The plan lists running sequences in running_'s order (Schedule walks it, then appends the
  // admitted ones), so one cursor finds them all (a search per sequence made a step O(n^2));
  // finished ones are released after the walk, which would shift the cursor's sequence.
  std::vector<int64_t> done;
  size_t cursor = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (finished[i] == kGone) continue;
    const int64_t request = plan.seqs[i].request;
    while (cursor < running_.size() && running_[cursor].request != request) ++cursor;
    Seq* s = cursor < running_.size() ? &running_[cursor] : Find(request);
    AFD_CHECK(s != nullptr && s->cache_seq >= 0, "scheduler: request {} is not running", request);
    if (cursor == running_.size()) cursor = 0;  // out of order (found by search): start over
    if (finished[i] == kFinished) {
      done.push_back(request);
      continue;
    }
    if (!plan.seqs[i].sample) continue;  // a prompt chunk: the rest comes in the next steps
    s->prefilled = true;
    if (s->id_pending) {  // the next step, planned ahead, holds its place
      s->tokens.back() = next_ids[i];
      s->id_pending = false;
    } else {
      s->tokens.push_back(next_ids[i]);
    }
  }
  for (int64_t request : done) {
    Seq* s = Find(request);
    if (s != nullptr && s->hold && s->cache_seq >= 0) {
      held_[request] = {s->cache_seq, s->computed};
      s->cache_seq = -1;  // kept: Abort below must not release it
      const int64_t seq_request = s->request;
      running_.erase(
          std::remove_if(running_.begin(), running_.end(),
                         [seq_request](const Seq& r) { return r.request == seq_request; }),
          running_.end());
      continue;
    }
    Abort(request);
  }
}

}  // namespace afd::runtime

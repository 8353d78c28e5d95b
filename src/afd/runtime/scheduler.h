// The continuous-batching scheduler over the paged latent cache (vLLM's rules):
//  * every running sequence that has computed its prompt decodes one token per step;
//  * waiting requests are admitted in arrival order while the step has room: at most
//    max_num_seqs running sequences and max_num_batched_tokens tokens per step (0: no limit),
//    and free cache blocks;
//  * without chunked prefill a prompt runs whole in one step (one larger than the budget still
//    runs alone when nothing else would); with chunked prefill (vLLM's default) a prompt that
//    does not fit the step's remaining token budget runs its first part now and the rest in the
//    next steps, ahead of new admissions, so that decodes never stall behind a long prompt;
//  * when a running sequence's next tokens need a block and none is free, the most recently
//    admitted running sequence is preempted: its blocks are freed and it returns to the front of
//    the waiting queue; when admitted again it recomputes its prompt and the tokens generated so
//    far (batch-invariant kernels make that give the same bits) and goes on.
// A sequence's logits row is its last token of the step when that token completes what it has
// to compute (it samples); with prompt_logprobs, every prompt token of its first computation too.
// Asynchronous scheduling (ScheduleAhead): the next step of pure decodes is planned while the
// step before it still runs, its ids taken on the device from that step's samples.
// KV transfers (prefill/decode disaggregation): a request may arrive with the cache rows of its
// first `cached` prompt positions computed elsewhere (written into its blocks by the import hook
// when it is admitted; it computes the rest), and a finished request may keep its cache
// sequence (hold) until TakeHeld hands it to the engine. A preempted request recomputes
// everything (its imported rows are gone with its blocks).
// Thread safety: none; one thread schedules and updates.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "afd/kv/paged_cache.h"
#include "afd/model/forward_batch.h"

namespace afd::runtime {

struct SchedulerLimits {
  int64_t max_num_seqs = 0;            // 0: no limit
  int64_t max_num_batched_tokens = 0;  // 0: no limit
  bool chunked_prefill = false;        // split prompts over steps (needs a token budget)
};

// What one sequence does in a planned step.
struct ScheduledSeq {
  int64_t request = 0;
  bool prefill = false;        // prompt (or recompute) tokens, not a decode token
  bool first_prefill = false;  // the prompt's first computation (prompt logprobs come from it)
  // Its last token completes what the sequence had to compute: its last logits row gives the
  // next token. False for a prompt chunk that is not the last.
  bool sample = true;
  int64_t first_row = 0;  // its first token row in the batch
  int64_t start = 0;      // the position of its first token in the sequence
  int64_t num_tokens = 0;
  int64_t first_logits_row = 0;  // index into batch.logits_rows of its first logits row
  int64_t num_logits_rows = 0;   // 1 (0 for a chunk that does not sample), or num_tokens with
                                 // prompt logprobs
};

struct StepPlan {
  model::ForwardBatch batch;
  std::vector<ScheduledSeq> seqs;  // in batch order: decodes first, then admitted prompts
  int64_t num_decode_tokens = 0;
  int64_t num_prefill_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  // `cache` must outlive the scheduler.
  Scheduler(SchedulerLimits limits, kv::PagedKvCache& cache);

  // Queues a request; prompt_logprobs: the first prefill returns logits of every prompt token.
  // cached (< prompt size): leading prompt positions whose rows the import hook writes at
  // admission; hold: when it finishes, its cache sequence is kept for TakeHeld. Throws
  // afd::Error when the prompt alone cannot ever fit in the cache.
  void Add(int64_t request, std::vector<int32_t> prompt, bool prompt_logprobs, int64_t cached = 0,
           bool hold = false);
  // Writes the rows of positions [0, cached) of `request` into cache sequence `cache_seq` (its
  // blocks reserved) and extends its length to `cached`; called at admission.
  using ImportHook = std::function<void(int64_t request, int64_t cache_seq, int64_t cached)>;
  void SetImportHook(ImportHook hook) { import_ = std::move(hook); }
  // The cache sequence a finished request with hold kept (its positions written), once.
  struct HeldCache {
    int64_t cache_seq = -1;
    int64_t positions = 0;
  };
  std::optional<HeldCache> TakeHeld(int64_t request);
  // Removes a request wherever it is (its blocks are freed).
  void Abort(int64_t request);
  bool HasWork() const { return !running_.empty() || !waiting_.empty(); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_preemptions() const { return preemptions_; }

  // The next step (empty when there is no work). Not while a step planned by ScheduleAhead
  // waits for its Update.
  StepPlan Schedule();
  // The step after `inflight` (planned, run, not yet Updated), planned before its sampled ids
  // are known: each running sequence decodes the token `inflight` samples for it, which the
  // device supplies (plan.batch.id_source: the token's logits row in `inflight`; the scheduler
  // holds a placeholder until Update(inflight, ...) brings the id). finishing[i]: inflight's
  // seqs[i] ends with that step whatever its id (max_tokens), so it is left out. Nothing (the
  // caller then waits for inflight's ids and calls Schedule) unless every running sequence
  // samples in inflight, none waits (or max_num_seqs run: none could join), and the cache has
  // room for every next token without a preemption; blocks reserved before finding that out
  // stay with their sequences.
  std::optional<StepPlan> ScheduleAhead(const StepPlan& inflight,
                                        const std::vector<char>& finishing);
  // What became of a planned sequence (Update's `finished`).
  enum Outcome : char {
    kContinues = 0,
    kFinished = 1,  // the request is done: its blocks are freed
    kGone = 2,      // ended before this step's results came (aborted, or finished by the step
                    // before when this one was planned ahead): ignored
  };
  // After the step ran: `next_ids[i]` is the token sampled for plan.seqs[i] (its last logits
  // row; ignored when it does not sample), `finished[i]` its Outcome.
  void Update(const StepPlan& plan, const std::vector<int32_t>& next_ids,
              const std::vector<char>& finished);

 private:
  struct Seq {
    int64_t request = 0;
    std::vector<int32_t> tokens;  // prompt + generated, the last not yet in the cache
    int64_t prompt_len = 0;
    int64_t cache_seq = -1;  // -1: holds no cache sequence (waiting)
    bool prompt_logprobs = false;
    bool prefilled = false;   // its prompt's logits were produced once
    int64_t computed = 0;     // tokens in the cache (running)
    bool id_pending = false;  // tokens.back() is a placeholder for an id not yet Updated
    int64_t cached = 0;       // prompt positions the import hook writes at admission
    bool hold = false;        // keep the cache sequence when finished
  };
  // Schedules `s` (running, holding a cache sequence) for `count` of its uncomputed tokens.
  void Plan(Seq& s, int64_t count, StepPlan& plan);
  // Frees the running sequence's cache and queues it first for recompute.
  void Preempt(size_t running_index);
  Seq* Find(int64_t request);

  SchedulerLimits limits_;
  kv::PagedKvCache& cache_;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;  // admission order
  int64_t preemptions_ = 0;
  ImportHook import_;
  std::map<int64_t, HeldCache> held_;  // finished requests' kept caches, by request
};

}  // namespace afd::runtime

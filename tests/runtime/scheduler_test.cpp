// The continuous-batching scheduler's rules (runtime/scheduler.h), on a small paged cache.
#include "afd/runtime/scheduler.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "afd/common/error.h"
#include "afd/model/model.h"
#include "testing/host_allocator.h"

namespace afd::runtime {
namespace {

// A cache of `blocks` blocks of 4 tokens (1 layer of width 8).
struct Fixture {
  explicit Fixture(int64_t blocks, SchedulerLimits limits)
      : cache(alloc, kv::CacheShape{1, 8, 4, blocks}), scheduler(limits, cache) {}
  testing_util::CountingAllocator alloc;
  kv::PagedKvCache cache;
  Scheduler scheduler;
  // Runs `plan` as the engine does (the forward pass commits the batch's tokens to the cache),
  // every sampling sequence drawing token 7; `finish`: requests that end with this step.
  void Run(const StepPlan& plan, const std::vector<int64_t>& finish = {}) {
    model::MoeModel::CommitBatch(plan.batch, cache);
    std::vector<int32_t> ids(plan.seqs.size(), 7);
    std::vector<char> done(plan.seqs.size(), Scheduler::kContinues);
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      for (int64_t r : finish) {
        if (plan.seqs[i].request == r) done[i] = Scheduler::kFinished;
      }
    }
    scheduler.Update(plan, ids, done);
  }
};

std::vector<int64_t> Requests(const StepPlan& p) {
  std::vector<int64_t> r;
  for (const ScheduledSeq& s : p.seqs) r.push_back(s.request);
  return r;
}

std::vector<int32_t> Prompt(int n) { return std::vector<int32_t>(n, 3); }

// Arrival order under max_num_seqs; decodes come first in a step's batch, then admitted prompts.
TEST(Scheduler, AdmitsInArrivalOrderUnderMaxNumSeqs) {
  Fixture f(64, {.max_num_seqs = 2});
  for (int r = 0; r < 3; ++r) f.scheduler.Add(r, Prompt(3), false);
  StepPlan p = f.scheduler.Schedule();
  EXPECT_EQ(Requests(p), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.num_prefill_tokens, 6);
  EXPECT_EQ(p.num_decode_tokens, 0);
  EXPECT_EQ(f.scheduler.num_waiting(), 1);
  f.Run(p);
  p = f.scheduler.Schedule();  // both decode; 2 wait for room
  EXPECT_EQ(Requests(p), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.num_decode_tokens, 2);
  EXPECT_FALSE(p.seqs[0].prefill);
  f.Run(p, {0});  // request 0 ends: its seat goes to request 2
  p = f.scheduler.Schedule();
  EXPECT_EQ(Requests(p), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(p.seqs[0].prefill);
  EXPECT_TRUE(p.seqs[1].prefill);
  EXPECT_EQ(p.num_decode_tokens, 1);
  EXPECT_EQ(p.num_prefill_tokens, 3);
  EXPECT_EQ(f.scheduler.num_waiting(), 0);
}

// A prompt over the token budget runs in chunks ahead of new admissions; only its last chunk
// samples, and decodes are never left out of a step for it.
TEST(Scheduler, ChunkedPrefillKeepsDecodesInEveryStep) {
  Fixture f(64, {.max_num_seqs = 8, .max_num_batched_tokens = 4, .chunked_prefill = true});
  f.scheduler.Add(0, Prompt(2), false);
  StepPlan p = f.scheduler.Schedule();
  f.Run(p);  // request 0 now decodes
  f.scheduler.Add(1, Prompt(10), false);
  f.scheduler.Add(2, Prompt(2), false);
  std::vector<int64_t> chunks;
  for (int step = 0; step < 4; ++step) {
    p = f.scheduler.Schedule();
    ASSERT_FALSE(p.empty());
    ASSERT_GE(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].request, 0) << "step " << step << ": the decode first";
    EXPECT_FALSE(p.seqs[0].prefill);
    EXPECT_LE(p.batch.size(), 4);
    for (const ScheduledSeq& s : p.seqs) {
      if (s.request != 1) continue;
      chunks.push_back(s.num_tokens);
      EXPECT_EQ(s.sample, s.start + s.num_tokens == 10) << "step " << step;
      EXPECT_EQ(s.num_logits_rows, s.sample ? 1 : 0);
    }
    f.Run(p);
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{3, 3, 3, 1}));  // 3 tokens a step beside the decode
}

// Out of blocks, the most recently admitted running sequence is preempted, waits first, and
// comes back recomputing its prompt and what it generated.
TEST(Scheduler, PreemptsTheLatestAdmittedAndRecomputesIt) {
  Fixture f(3, {.max_num_seqs = 8});  // 12 token slots
  f.scheduler.Add(0, Prompt(4), false);
  f.scheduler.Add(1, Prompt(3), false);
  StepPlan p = f.scheduler.Schedule();
  ASSERT_EQ(Requests(p), (std::vector<int64_t>{0, 1}));
  f.Run(p);
  int steps = 0;
  while (f.scheduler.num_preemptions() == 0 && steps < 16) {
    p = f.scheduler.Schedule();
    ASSERT_FALSE(p.empty());
    f.Run(p);
    ++steps;
  }
  ASSERT_EQ(f.scheduler.num_preemptions(), 1);
  EXPECT_EQ(f.scheduler.num_waiting(), 1);
  EXPECT_EQ(f.scheduler.num_running(), 1);
  // Request 0 runs on alone until it ends; then request 1 recomputes everything it had.
  p = f.scheduler.Schedule();
  ASSERT_EQ(Requests(p), (std::vector<int64_t>{0}));
  f.Run(p, {0});
  p = f.scheduler.Schedule();
  ASSERT_EQ(Requests(p), (std::vector<int64_t>{1}));
  EXPECT_TRUE(p.seqs[0].prefill);
  EXPECT_EQ(p.seqs[0].start, 0);
  EXPECT_GT(p.seqs[0].num_tokens, 3);  // its prompt and the tokens it had generated
}

TEST(Scheduler, AbortFreesItsBlocksWherever) {
  Fixture f(4, {.max_num_seqs = 1});
  f.scheduler.Add(0, Prompt(5), false);
  f.scheduler.Add(1, Prompt(5), false);
  StepPlan p = f.scheduler.Schedule();
  f.Run(p);
  EXPECT_LT(f.cache.num_free_blocks(), 4);
  f.scheduler.Abort(1);  // waiting
  f.scheduler.Abort(0);  // running
  EXPECT_EQ(f.cache.num_free_blocks(), 4);
  EXPECT_FALSE(f.scheduler.HasWork());
  EXPECT_TRUE(f.scheduler.Schedule().empty());
}

TEST(Scheduler, RefusesAPromptTheCacheCanNeverHold) {
  Fixture f(2, {});
  EXPECT_THROW(f.scheduler.Add(0, Prompt(8), false), Error);  // 8 + 1 tokens: 3 blocks
  EXPECT_THROW(f.scheduler.Add(0, {}, false), Error);
  EXPECT_THROW(Scheduler({.max_num_batched_tokens = 0, .chunked_prefill = true}, f.cache), Error);
}

}  // namespace
}  // namespace afd::runtime

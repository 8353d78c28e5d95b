// Continuous batching: capping the running sequences or the tokens per step changes how steps
// are composed (prompts join while others decode: mixed steps) but never the results.
#include <gtest/gtest.h>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/runtime/generator.h"

namespace afd::runtime {
namespace {

// Counts the steps and whether any step mixed decode and prefill tokens.
class CountingRunner : public StepRunner {
 public:
  explicit CountingRunner(const model::MoeModel& m) : local_(m) {}
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                 Workspace& ws) override {
    bool prefill = false, decode = false;
    for (int64_t i = 0; i < batch.size(); ++i) {
      // A prefill token either starts a sequence or follows another token of the same step.
      const bool continues = i > 0 && batch.seq_index[i - 1] == batch.seq_index[i];
      if (batch.positions[i] == 0 || continues) {
        prefill = true;
      } else {
        decode = true;
      }
    }
    mixed_steps += prefill && decode;
    ++steps;
    return local_.Forward(batch, cache, ws);
  }
  int steps = 0;
  int mixed_steps = 0;

 private:
  LocalStepRunner local_;
};

// Bitwise the same ids, log-probabilities and prompt log-probabilities (tokens are computed
// alone whatever else shares their step).
void ExpectSameResults(const std::vector<GenerationResult>& got,
                       const std::vector<GenerationResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(got[s].output_ids, want[s].output_ids) << "prompt " << s;
    EXPECT_EQ(got[s].logprobs, want[s].logprobs) << "prompt " << s;
    ASSERT_EQ(got[s].prompt_logprobs.size(), want[s].prompt_logprobs.size());
    for (size_t j = 1; j < want[s].prompt_logprobs.size(); ++j) {
      EXPECT_EQ(got[s].prompt_logprobs[j], want[s].prompt_logprobs[j]) << s << " " << j;
    }
  }
}

TEST(ContinuousBatching, LimitsChangeTheStepsNotTheResults) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3, 4, 5}, {7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17}, {20, 21}, {30, 31, 32, 33}};
  GenerationOptions base;
  base.prompt_logprobs = true;
  base.max_tokens = 7;
  base.ignore_eos = true;
  Generator reference(*model);
  const auto want = reference.Generate(prompts, base);

  struct Limits {
    int64_t seqs, tokens;
    bool chunked;
  };
  for (const Limits lim :
       {Limits{1, 0, false}, Limits{2, 0, false}, Limits{0, 10, false}, Limits{3, 10, false},
        Limits{0, 3, true}, Limits{2, 5, true}, Limits{0, 1, true}}) {
    SCOPED_TRACE(testing::Message() << "max_num_seqs " << lim.seqs << ", max_num_batched_tokens "
                                    << lim.tokens << (lim.chunked ? ", chunked" : ""));
    GenerationOptions o = base;
    o.max_num_seqs = lim.seqs;
    o.max_num_batched_tokens = lim.tokens;
    o.chunked_prefill = lim.chunked;
    CountingRunner runner(*model);
    Generator g(*model, runner);
    ExpectSameResults(g.Generate(prompts, o), want);
    EXPECT_GT(runner.steps, 7);  // the prompts did not all run together
    if (lim.tokens > 1) {
      EXPECT_GT(runner.mixed_steps, 0);  // prompts joined running ones
    }
  }
}

TEST(ContinuousBatching, PreemptionByRecomputeKeepsTheResults) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3, 4, 5}, {7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17}, {20, 21}};
  GenerationOptions base;
  base.max_tokens = 70;  // every sequence grows past one 64-token block
  base.ignore_eos = true;
  base.sampling = {0.8f, 20, 0.9f, 3};  // sampled: the random streams must survive a recompute
  Generator g(*model);
  GenerationStats roomy_stats, tight_stats;
  const auto want = g.Generate(prompts, base, &roomy_stats);
  EXPECT_EQ(roomy_stats.preemptions, 0);
  GenerationOptions tight = base;
  tight.num_kv_blocks = 5;  // 4 sequences need 8 blocks at the end
  const auto got = g.Generate(prompts, tight, &tight_stats);
  EXPECT_GT(tight_stats.preemptions, 0);
  EXPECT_LE(tight_stats.peak_kv_blocks, 5);
  ExpectSameResults(got, want);
  // A prompt that can never fit is an error, not a hang.
  GenerationOptions tiny = base;
  tiny.num_kv_blocks = 1;
  EXPECT_THROW(g.Generate({std::vector<int32_t>(70, 3)}, tiny), Error);
}

TEST(ContinuousBatching, ChunkedPrefillUnderPreemptionKeepsTheResults) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  std::vector<std::vector<int32_t>> prompts = {std::vector<int32_t>(100, 0), {7, 8, 9}, {20, 21}};
  for (size_t i = 0; i < prompts[0].size(); ++i) prompts[0][i] = static_cast<int32_t>(i % 50 + 1);
  GenerationOptions base;
  base.max_tokens = 40;
  base.ignore_eos = true;
  base.prompt_logprobs = true;
  base.sampling = {0.7f, 0, 0.95f, 11};
  Generator g(*model);
  const auto want = g.Generate(prompts, base);
  GenerationOptions o = base;
  o.chunked_prefill = true;
  o.max_num_batched_tokens = 16;  // the long prompt takes 7 steps, beside the decodes
  o.num_kv_blocks = 3;            // and the cache is tight: someone is preempted
  GenerationStats st;
  const auto got = g.Generate(prompts, o, &st);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.mixed_steps, 0);
  ExpectSameResults(got, want);
}

TEST(ContinuousBatching, APromptLargerThanTheBudgetStillRuns) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  GenerationOptions o;
  o.max_tokens = 3;
  o.max_num_batched_tokens = 2;
  Generator g(*model);
  const auto got = g.Generate({{1, 2, 3, 4, 5, 6}, {7, 8, 9}}, o);
  EXPECT_EQ(got[0].output_ids.size(), 3u);
  EXPECT_EQ(got[1].output_ids.size(), 3u);
}

// Asynchronous scheduling (a step of decodes launched before the previous step's ids reach the
// host) gives the results of waiting for them, under preemption, chunked prefill, sampling and
// prompt log-probabilities, and runs steps ahead whenever a step is all decodes.
TEST(ContinuousBatching, AsyncSchedulingKeepsTheResults) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  std::vector<std::vector<int32_t>> prompts = {
      std::vector<int32_t>(100, 0), {7, 8, 9}, {20, 21}, {1, 2, 3, 4, 5}};
  for (size_t i = 0; i < prompts[0].size(); ++i) prompts[0][i] = static_cast<int32_t>(i % 50 + 1);
  struct Case {
    int64_t blocks, budget;
    bool chunked, prompt_logprobs;
    int64_t min_ahead;  // steps that must run ahead
    int64_t max_seqs = 0;
  };
  // Budget 2: at most 2 of the 4 sequences decode in a step, so none runs ahead (each step
  // leaves someone behind).
  for (const Case c :
       {Case{0, 0, false, false, 60}, Case{5, 0, false, false, 40}, Case{3, 16, true, true, 40},
        Case{0, 0, false, true, 60}, Case{0, 2, false, true, 0},
        // Two of four run while two wait: steps still run ahead (no one could join them).
        Case{0, 0, false, false, 100, 2}}) {
    SCOPED_TRACE(testing::Message()
                 << "blocks " << c.blocks << ", budget " << c.budget << ", max_num_seqs "
                 << c.max_seqs << (c.chunked ? ", chunked" : "")
                 << (c.prompt_logprobs ? ", prompt logprobs" : ""));
    GenerationOptions o;
    o.max_tokens = 70;  // past a 64-token block
    o.ignore_eos = true;
    o.sampling = {0.7f, 0, 0.95f, 11};
    o.num_kv_blocks = c.blocks;
    o.max_num_batched_tokens = c.budget;
    o.max_num_seqs = c.max_seqs;
    o.chunked_prefill = c.chunked;
    o.prompt_logprobs = c.prompt_logprobs;
    o.async_scheduling = AsyncScheduling::kOn;  // kAuto: only where the backend is asynchronous
    Generator g(*model);
    GenerationOptions sync = o;
    sync.async_scheduling = AsyncScheduling::kOff;
    GenerationStats want_stats, got_stats;
    const auto want = g.Generate(prompts, sync, &want_stats);
    const auto got = g.Generate(prompts, o, &got_stats);
    EXPECT_EQ(want_stats.ahead_steps, 0);
    EXPECT_GE(got_stats.ahead_steps, c.min_ahead);
    EXPECT_EQ(got_stats.preemptions, want_stats.preemptions);
    EXPECT_EQ(got_stats.decode_tokens + got_stats.mixed_decode_tokens,
              want_stats.decode_tokens + want_stats.mixed_decode_tokens);
    ExpectSameResults(got, want);
  }
}

}  // namespace
}  // namespace afd::runtime

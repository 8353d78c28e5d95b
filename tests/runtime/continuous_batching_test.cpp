// Continuous batching: capping the running sequences or the tokens per step changes how steps
// are composed (prompts join while others decode: mixed steps) but never the results.
#include <gtest/gtest.h>

#include "afd/model/loader.h"
#include "afd/runtime/generator.h"

namespace afd::runtime {
namespace {

// Counts the steps and whether any step mixed decode and prefill tokens.
class CountingRunner : public StepRunner {
 public:
  CountingRunner(const model::DeepseekModel& m, model::MoeBackend& moe) : local_(m, moe) {}
  void Forward(const model::ForwardBatch& batch, model::MlaKvCache& cache, float* logits) override {
    bool prefill = false, decode = false;
    for (int64_t i = 0; i < batch.size(); ++i) {
      // A prefill token either starts a sequence or follows another token of the same step.
      const bool continues = i > 0 && batch.seq_slots[i - 1] == batch.seq_slots[i];
      if (batch.positions[i] == 0 || continues) {
        prefill = true;
      } else {
        decode = true;
      }
    }
    mixed_steps += prefill && decode;
    ++steps;
    local_.Forward(batch, cache, logits);
  }
  int steps = 0;
  int mixed_steps = 0;

 private:
  LocalStepRunner local_;
};

TEST(ContinuousBatching, LimitsChangeTheStepsNotTheResults) {
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{});
  model::LocalMoeBackend moe(model->config(), model->weights());
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3, 4, 5}, {7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17}, {20, 21}, {30, 31, 32, 33}};
  GenerationOptions base;
  base.max_tokens = 7;
  base.ignore_eos = true;
  Generator reference(*model, moe);
  const auto want = reference.Generate(prompts, base);

  struct Limits {
    int64_t seqs, tokens;
  };
  for (const Limits lim : {Limits{1, 0}, Limits{2, 0}, Limits{0, 10}, Limits{3, 10}}) {
    SCOPED_TRACE(testing::Message()
                 << "max_num_seqs " << lim.seqs << ", max_num_batched_tokens " << lim.tokens);
    GenerationOptions o = base;
    o.max_num_seqs = lim.seqs;
    o.max_num_batched_tokens = lim.tokens;
    CountingRunner runner(*model, moe);
    Generator g(*model, runner);
    const auto got = g.Generate(prompts, o);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {
      EXPECT_EQ(got[s].output_ids, want[s].output_ids);
      EXPECT_EQ(got[s].logprobs, want[s].logprobs);  // bitwise: tokens are computed alone
      ASSERT_EQ(got[s].prompt_logprobs.size(), want[s].prompt_logprobs.size());
      for (size_t j = 1; j < want[s].prompt_logprobs.size(); ++j) {
        EXPECT_EQ(got[s].prompt_logprobs[j], want[s].prompt_logprobs[j]);
      }
    }
    EXPECT_GT(runner.steps, 7);  // the prompts did not all run together
    if (lim.tokens > 0) {
      EXPECT_GT(runner.mixed_steps, 0);  // prompts joined running ones
    }
  }
}

TEST(ContinuousBatching, APromptLargerThanTheBudgetStillRuns) {
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{});
  model::LocalMoeBackend moe(model->config(), model->weights());
  GenerationOptions o;
  o.max_tokens = 3;
  o.max_num_batched_tokens = 2;
  Generator g(*model, moe);
  const auto got = g.Generate({{1, 2, 3, 4, 5, 6}, {7, 8, 9}}, o);
  EXPECT_EQ(got[0].output_ids.size(), 3u);
  EXPECT_EQ(got[1].output_ids.size(), 3u);
}

}  // namespace
}  // namespace afd::runtime

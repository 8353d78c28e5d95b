// Generation: batched prefill + decode against the transformers golden data, EOS handling,
// and sampling (determinism for a seed, top_k = 1 is greedy, seeds matter).
#include "afd/runtime/generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"

namespace afd::runtime {
namespace {

using model::MoeModel;

TEST(Generator, BatchedGreedyMatchesTransformers) {
  for (const std::string name : {"v2_group_limited", "v3_noaux_tc"}) {
    const std::string dir = std::string(AFD_SOURCE_DIR) + "/tests/data/golden/" + name;
    std::ifstream in(dir + "/golden.json");
    const nlohmann::json golden = nlohmann::json::parse(in);
    kernels::cpu::CpuBackend cpu;
    const auto model = model::OpenModel(dir, model::OpenOptions{}, cpu);
    Generator gen(*model);
    GenerationOptions options;
    options.prompt_logprobs = true;
    options.max_tokens = golden["greedy_max_new_tokens"].get<int>();
    options.ignore_eos = true;
    const auto prompts = golden["prompts"].get<std::vector<std::vector<int32_t>>>();
    const auto results = gen.Generate(prompts, options);  // all prompts in one batch
    ASSERT_EQ(results.size(), prompts.size());
    for (size_t p = 0; p < prompts.size(); ++p) {
      EXPECT_EQ(results[p].output_ids, golden["greedy_output_ids"][p].get<std::vector<int32_t>>())
          << name << " prompt " << p;
      EXPECT_TRUE(std::isnan(results[p].prompt_logprobs[0]));
      for (size_t j = 1; j < prompts[p].size(); ++j) {
        EXPECT_NEAR(results[p].prompt_logprobs[j], golden["prompt_logprobs"][p][j].get<double>(),
                    1e-4);
      }
      ASSERT_EQ(results[p].logprobs.size(), results[p].output_ids.size());
      for (float lp : results[p].logprobs) EXPECT_LE(lp, 0.0f);
    }
  }
}

class TinyGeneratorTest : public ::testing::Test {
 protected:
  std::vector<GenerationResult> Run(const model::ModelConfig& config,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const GenerationOptions& options) {
    kernels::cpu::CpuBackend cpu;
    MoeModel model(config, model::RandomWeights(config, 0, model::WeightOptions{}), cpu);
    Generator gen(model);
    return gen.Generate(prompts, options);
  }
  model::ModelConfig config_ = model::PresetConfig("tiny");
  std::vector<std::vector<int32_t>> prompts_ = {{10, 20, 30}, {7}};
};

TEST_F(TinyGeneratorTest, StopsAtEosUnlessIgnored) {
  GenerationOptions options;
  options.max_tokens = 6;
  options.ignore_eos = true;
  const auto ref = Run(config_, prompts_, options);
  ASSERT_EQ(ref[0].output_ids.size(), 6u);
  const int32_t eos = ref[0].output_ids[2];
  const auto first = std::find(ref[0].output_ids.begin(), ref[0].output_ids.end(), eos);
  model::ModelConfig with_eos = config_;
  with_eos.eos_token_ids = {eos};
  const auto ignored = Run(with_eos, prompts_, options);
  EXPECT_EQ(ignored[0].output_ids, ref[0].output_ids);
  options.ignore_eos = false;
  const auto stopped = Run(with_eos, prompts_, options);
  EXPECT_EQ(stopped[0].output_ids,
            std::vector<int32_t>(ref[0].output_ids.begin(), first + 1));  // EOS included
  // The other sequence of the batch is unaffected up to its own EOS.
  const auto second = std::find(ref[1].output_ids.begin(), ref[1].output_ids.end(), eos);
  EXPECT_EQ(stopped[1].output_ids,
            std::vector<int32_t>(ref[1].output_ids.begin(),
                                 second == ref[1].output_ids.end() ? second : second + 1));
}

// With prompt log-probs each prompt position j >= 1 also names the most likely token after
// ids[<j]: the argmax (first maximum) of the logits at j - 1.
TEST_F(TinyGeneratorTest, PromptTop1IsEachPositionsArgmax) {
  GenerationOptions options;
  options.max_tokens = 1;
  options.keep_prompt_logits = true;
  const std::vector<std::vector<int32_t>> prompts = {{10, 20, 30, 40, 50, 60}, {7, 8}};
  const auto r = Run(config_, prompts, options);
  const int64_t vocab = config_.vocab_size;
  for (size_t p = 0; p < prompts.size(); ++p) {
    ASSERT_EQ(r[p].prompt_top1.size(), prompts[p].size());
    EXPECT_EQ(r[p].prompt_top1[0], -1);
    for (size_t j = 1; j < prompts[p].size(); ++j) {
      const float* row = r[p].prompt_logits.data() + (j - 1) * vocab;
      EXPECT_EQ(r[p].prompt_top1[j], std::max_element(row, row + vocab) - row)
          << "prompt " << p << " position " << j;
    }
  }
  options.keep_prompt_logits = false;  // without prompt log-probs: none
  EXPECT_TRUE(Run(config_, prompts, options)[0].prompt_top1.empty());
}

TEST_F(TinyGeneratorTest, Sampling) {
  GenerationOptions greedy;
  greedy.max_tokens = 8;
  greedy.ignore_eos = true;
  const auto g = Run(config_, prompts_, greedy);

  GenerationOptions top1 = greedy;
  top1.sampling = {1.5f, 1, 1.0f, 123};
  EXPECT_EQ(Run(config_, prompts_, top1)[0].output_ids, g[0].output_ids);

  GenerationOptions hot = greedy;
  hot.max_tokens = 24;
  hot.sampling = {2.0f, 0, 1.0f, 5};
  const auto a = Run(config_, prompts_, hot);
  const auto b = Run(config_, prompts_, hot);
  EXPECT_EQ(a[0].output_ids, b[0].output_ids);  // same seed, same tokens
  EXPECT_EQ(a[1].output_ids, b[1].output_ids);
  hot.sampling.seed = 6;
  EXPECT_NE(Run(config_, prompts_, hot)[0].output_ids, a[0].output_ids);
  // A batch does not change a sequence's samples.
  hot.sampling.seed = 5;
  EXPECT_EQ(Run(config_, {prompts_[0]}, hot)[0].output_ids, a[0].output_ids);

  GenerationOptions bad = greedy;
  bad.sampling.top_p = 0.0f;
  EXPECT_THROW(Run(config_, prompts_, bad), Error);
  EXPECT_THROW(Run(config_, {{}}, greedy), Error);
  EXPECT_THROW(Run(config_, {{1024}}, greedy), Error);
}

// One draw of the CPU backend's Sample op on one row.
int32_t SampleOnce(std::vector<float> logits, Sampler& s) {
  kernels::cpu::CpuBackend cpu;
  int32_t id = -1;
  const int64_t v = static_cast<int64_t>(logits.size());
  cpu.Sample(Tensor(logits.data(), DType::kF32, {1, v}), {s.NextRow()},
             Tensor(&id, DType::kI32, {1}));
  return id;
}

TEST(Sampler, TopPKeepsTheSmallestSufficientPrefix) {
  // p ~ {0.64, 0.24, 0.09, 0.03}: top_p 0.6 keeps only the first token.
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  Sampler s({1.0f, 0, 0.6f, 9}, 0);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleOnce(logits, s), 0);
  Sampler all({1.0f, 0, 1.0f, 9}, 0);
  std::vector<int> counts(4);
  for (int i = 0; i < 2000; ++i) ++counts[SampleOnce(logits, all)];
  EXPECT_GT(counts[3], 10);  // the unlikely token does get sampled
  EXPECT_GT(counts[0], counts[1]);
}

TEST(Sampler, NaNLogitsAreNeverChosen) {
  const float nan = std::nanf("");
  Sampler greedy({0.0f, 0, 1.0f, 0}, 0);
  EXPECT_EQ(SampleOnce({nan, 1.0f, 3.0f, nan}, greedy), 2);
  EXPECT_EQ(SampleOnce({nan, nan}, greedy), 0);  // nothing to choose: the first id
  Sampler hot({1.0f, 0, 1.0f, 3}, 0);
  for (int i = 0; i < 200; ++i) {
    const int32_t id = SampleOnce({nan, 0.0f, 0.5f, nan}, hot);
    EXPECT_TRUE(id == 1 || id == 2) << id;
  }
}

}  // namespace
}  // namespace afd::runtime

// The model against Hugging Face transformers 5.17 (tests/data/golden, see its README): logits
// of every prompt position within 1e-4 relative Frobenius error, the same prompt logprobs, and
// identical 12-token greedy continuations computed with the KV cache (prefill + decode).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afd/kernels/cpu/ops.h"
#include "afd/model/loader.h"
#include "model/npy_reader.h"

namespace afd::model {
namespace {

std::string CaseDir(const std::string& name) {
  return std::string(AFD_SOURCE_DIR) + "/tests/data/golden/" + name;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

double RelFrobenius(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// Prefill of `prompt` into a fresh cache slot; returns the logits [T, V].
std::vector<float> Prefill(const DeepseekModel& model, MoeBackend& moe, MlaKvCache& cache, int slot,
                           const std::vector<int32_t>& prompt) {
  ForwardBatch batch;
  batch.Add(slot, prompt, 0);
  std::vector<float> logits(prompt.size() * model.config().vocab_size);
  model.Forward(batch, cache, moe, logits.data());
  return logits;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = CaseDir(GetParam());
  const nlohmann::json golden = ReadJson(dir + "/golden.json");
  OpenOptions options;
  const auto model = OpenModel(dir, options);
  LocalMoeBackend moe(model->config(), model->weights());
  const int64_t vocab = model->config().vocab_size;
  const int max_new = golden["greedy_max_new_tokens"].get<int>();
  for (size_t p = 0; p < golden["prompts"].size(); ++p) {
    const auto prompt = golden["prompts"][p].get<std::vector<int32_t>>();
    const int64_t t = prompt.size();
    MlaKvCache cache = model->NewCache();
    const int slot = cache.AddSequence(t + max_new);
    const std::vector<float> logits = Prefill(*model, moe, cache, slot, prompt);

    const testing::NpyArray ref =
        testing::ReadNpyF32(dir + "/" + golden["prompt_logits_files"][p].get<std::string>());
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{t, vocab}));
    const double err = RelFrobenius(logits, ref.data);
    EXPECT_LT(err, 1e-4) << GetParam() << " prompt " << p;
    std::printf("%s prompt %zu: rel err %.3g\n", GetParam().c_str(), p, err);

    std::vector<float> logprobs(vocab);
    for (int64_t j = 1; j < t; ++j) {
      kernels::LogSoftmax(logits.data() + (j - 1) * vocab, vocab, logprobs.data());
      EXPECT_NEAR(logprobs[prompt[j]], golden["prompt_logprobs"][p][j].get<double>(), 1e-4)
          << GetParam() << " prompt " << p << " position " << j;
    }

    // Greedy decode over the cache.
    std::vector<int32_t> out;
    int32_t next = kernels::ArgMax(logits.data() + (t - 1) * vocab, vocab);
    std::vector<float> step(vocab);
    for (int i = 0; i < max_new; ++i) {
      out.push_back(next);
      if (i + 1 == max_new) break;
      ForwardBatch batch;
      batch.Add(slot, {next}, t + i);
      model->Forward(batch, cache, moe, step.data());
      next = kernels::ArgMax(step.data(), vocab);
    }
    EXPECT_EQ(out, golden["greedy_output_ids"][p].get<std::vector<int32_t>>())
        << GetParam() << " prompt " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTest,
                         ::testing::Values("v2_greedy_yarn", "v2_group_limited", "v3_noaux_tc",
                                           "v3_sharded"));

}  // namespace
}  // namespace afd::model

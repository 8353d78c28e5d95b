// The model against Hugging Face transformers 5.17 (tests/data/golden, see its README): logits
// of every prompt position within 1e-4 relative Frobenius error, the same prompt logprobs, and
// identical 12-token greedy continuations computed with the KV cache (prefill + decode).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afd/model/loader.h"
#include "model/npy_reader.h"
#include "testing/model_harness.h"

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

// log_softmax(x)[id] in double, and the first argmax: the test's own references.
double LogProb(const float* x, int64_t n, int32_t id) {
  double max = x[0], sum = 0;
  for (int64_t i = 1; i < n; ++i) max = std::max<double>(max, x[i]);
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - max);
  return x[id] - max - std::log(sum);
}
int32_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) best = x[i] > x[best] ? i : best;
  return static_cast<int32_t>(best);
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = CaseDir(GetParam());
  const nlohmann::json golden = ReadJson(dir + "/golden.json");
  testing_util::ModelHarness h(dir);
  const int64_t vocab = h.vocab();
  const int max_new = golden["greedy_max_new_tokens"].get<int>();
  for (size_t p = 0; p < golden["prompts"].size(); ++p) {
    const auto prompt = golden["prompts"][p].get<std::vector<int32_t>>();
    const int64_t t = prompt.size();
    const int64_t seq = h.NewSequence(t + max_new);
    ForwardBatch prefill;
    h.Add(prefill, seq, prompt, 0);
    const std::vector<float> logits = h.Run(prefill);

    const testing::NpyArray ref =
        testing::ReadNpyF32(dir + "/" + golden["prompt_logits_files"][p].get<std::string>());
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{t, vocab}));
    const double err = RelFrobenius(logits, ref.data);
    EXPECT_LT(err, 1e-4) << GetParam() << " prompt " << p;
    std::printf("%s prompt %zu: rel err %.3g\n", GetParam().c_str(), p, err);

    for (int64_t j = 1; j < t; ++j) {
      EXPECT_NEAR(LogProb(logits.data() + (j - 1) * vocab, vocab, prompt[j]),
                  golden["prompt_logprobs"][p][j].get<double>(), 1e-4)
          << GetParam() << " prompt " << p << " position " << j;
    }

    // Greedy decode over the cache.
    std::vector<int32_t> out;
    int32_t next = ArgMax(logits.data() + (t - 1) * vocab, vocab);
    for (int i = 0; i < max_new; ++i) {
      out.push_back(next);
      if (i + 1 == max_new) break;
      ForwardBatch batch;
      h.Add(batch, seq, {next}, t + i);
      next = ArgMax(h.Run(batch).data(), vocab);
    }
    EXPECT_EQ(out, golden["greedy_output_ids"][p].get<std::vector<int32_t>>())
        << GetParam() << " prompt " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTest,
                         ::testing::Values("v2_greedy_yarn", "v2_group_limited", "v3_noaux_tc",
                                           "v3_sharded", "v3_trained", "v3_trained_fp8",
                                           "v2_tied_fp16", "v3_wide_fp32", "v2_odd_sharded",
                                           "qwen3_gqa", "qwen3_sparse_tied", "qwen3_trained",
                                           "qwen3_legacy_config"));

}  // namespace
}  // namespace afd::model

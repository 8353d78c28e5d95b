// Router variants on hand-made logits, and the expert-parallel pieces: partial sums over expert
// ranges, routing computed elsewhere, and loading only a range of experts.
#include "afd/model/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "afd/common/error.h"
#include "afd/model/experts.h"
#include "afd/model/loader.h"
#include "afd/model/moe_backend.h"

namespace afd::model {
namespace {

ModelConfig SmallMoe(TopkMethod method, int64_t k) {
  ModelConfig c;
  c.model_type = method == TopkMethod::kNoauxTc ? ModelType::kDeepseekV3 : ModelType::kDeepseekV2;
  c.scoring_func = method == TopkMethod::kNoauxTc ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  c.topk_method = method;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = k;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  return c;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed Route(const ModelConfig& c, const MoeWeights& w, const std::vector<float>& logits) {
  Routed r{std::vector<int32_t>(c.num_experts_per_tok), std::vector<float>(c.num_experts_per_tok)};
  RouteFromLogits(c, w, logits.data(), 1, r.ids.data(), r.weights.data());
  return r;
}

std::vector<float> Softmax(std::vector<float> v) {
  double sum = 0;
  for (float x : v) sum += std::exp(x);
  for (float& x : v) x = std::exp(x) / sum;
  return v;
}

// Groups of 2: {5, 0} {4.9, 0} {4.8, 0} {4.7, 4.6}.
const std::vector<float> kLogits = {5, 0, 4.9f, 0, 4.8f, 0, 4.7f, 4.6f};

TEST(Router, V2Greedy) {
  const ModelConfig c = SmallMoe(TopkMethod::kGreedy, 3);
  const Routed r = Route(c, MoeWeights{}, kLogits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2, 4}));
  const auto p = Softmax(kLogits);
  EXPECT_NEAR(r.weights[1], p[2] * 2.5, 1e-6);  // never renormalised, always scaled
}

TEST(Router, V2GroupLimitedKeepsBestGroupsByMax) {
  const ModelConfig c = SmallMoe(TopkMethod::kGroupLimitedGreedy, 3);
  const Routed r = Route(c, MoeWeights{}, kLogits);
  // Groups 0 and 1 have the largest maxima; the third pick is the tie 1 vs 3 (lower id wins).
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  const auto p = Softmax(kLogits);
  EXPECT_NEAR(r.weights[1], p[1] * 2.5, 1e-7);
}

TEST(Router, V3NoauxTcGroupsByTop2SumBiasSelectsOnly) {
  ModelConfig c = SmallMoe(TopkMethod::kNoauxTc, 2);
  c.norm_topk_prob = true;
  MoeWeights w;
  w.e_score_correction_bias.assign(8, 0.0f);
  w.e_score_correction_bias[7] = 10.0f;
  // Group sums of sigmoid: g0 {3, -10} ~0.95 (max 0.95), g1 {2, 2} ~1.76 (max 0.88), g3 has the
  // biased expert 7. Top-2 sums keep g3 and g1 (a max would keep g0).
  const std::vector<float> logits = {3, -10, 2, 2, -10, -10, -10, -10};
  Routed r = Route(c, w, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 7}));
  const double s2 = 1 / (1 + std::exp(-2.0)), s7 = 1 / (1 + std::exp(10.0));
  EXPECT_NEAR(r.weights[0], 2.5 * s2 / (s2 + s7), 1e-6);  // unbiased, normalised, then scaled
  EXPECT_NEAR(r.weights[1], 2.5 * s7 / (s2 + s7), 1e-6);
  c.norm_topk_prob = false;
  r = Route(c, w, logits);
  EXPECT_NEAR(r.weights[0], 2.5 * s2, 1e-6);
}

class ExpertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = PresetConfig("tiny");
    weights_ = RandomWeights(config_, 7, WeightOptions{});
    std::mt19937 gen(3);
    std::normal_distribution<float> dist;
    hidden_.resize(kTokens * config_.hidden_size);
    for (float& v : hidden_) v = dist(gen);
    const int64_t k = config_.num_experts_per_tok;
    ids_.resize(kTokens * k);
    weights_k_.resize(kTokens * k);
    RouteTokens(config_, moe(), hidden_.data(), kTokens, ids_.data(), weights_k_.data());
  }
  const MoeWeights& moe() const { return weights_.layers[kLayer].moe; }
  std::vector<float> Routed(const MoeWeights& w, int64_t begin, int64_t end) const {
    std::vector<float> out(hidden_.size());
    RoutedExperts(config_, w, hidden_.data(), kTokens, ids_.data(), weights_k_.data(), begin, end,
                  out.data());
    return out;
  }

  static constexpr int64_t kTokens = 9;
  static constexpr int64_t kLayer = 2;
  ModelConfig config_;
  ModelWeights weights_;
  std::vector<float> hidden_, weights_k_;
  std::vector<int32_t> ids_;
};

TEST_F(ExpertsTest, PartialSumsOverExpertRangesAddUp) {
  const int64_t e = config_.n_routed_experts;
  const std::vector<float> full = Routed(moe(), 0, e);
  for (int64_t split : {1, 3, 5}) {
    std::vector<float> a = Routed(moe(), 0, split), b = Routed(moe(), split, e);
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_NEAR(a[i] + b[i], full[i], 1e-5 * (1 + std::fabs(full[i]))) << "split " << split;
    }
  }
  // An empty range contributes exact zeros.
  for (float v : Routed(moe(), 2, 2)) EXPECT_EQ(v, 0.0f);
}

TEST_F(ExpertsTest, LocalBackendEqualsRoutingComputedElsewhere) {
  LocalMoeBackend backend(config_, weights_);
  std::vector<float> local(hidden_.size()), remote(hidden_.size());
  backend.Forward(kLayer, hidden_.data(), kTokens, local.data());
  MoeForwardWithRouting(config_, moe(), hidden_.data(), kTokens, ids_.data(), weights_k_.data(), 0,
                        config_.n_routed_experts, true, remote.data());
  EXPECT_EQ(local, remote);
}

TEST_F(ExpertsTest, LoadingAnExpertRangeGivesTheSameBits) {
  WeightOptions options;
  options.load_attention = false;
  options.expert_begin = 2;
  options.expert_end = 6;
  const ModelWeights part = RandomWeights(config_, 7, options);
  const MoeWeights& w = part.layers[kLayer].moe;
  EXPECT_TRUE(w.experts[1].empty());
  EXPECT_FALSE(w.experts[2].empty());
  EXPECT_EQ(Routed(w, 2, 6), Routed(moe(), 2, 6));
  bool uses_unloaded = false;
  for (int32_t id : ids_) uses_unloaded |= id < 2 || id >= 6;
  ASSERT_TRUE(uses_unloaded);  // 9 tokens x 2 picks among 8 experts
  EXPECT_THROW(Routed(w, 0, 8), Error);
}

}  // namespace
}  // namespace afd::model

// Router variants on hand-made logits, and the expert-parallel pieces: partial sums over expert
// ranges, routing computed elsewhere, and loading only a range of experts.
#include "afd/model/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/model/moe_backend.h"
#include "testing/model_harness.h"

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

// One token's routing from its logits through the CPU backend's RouterTopk.
Routed Route(const ModelConfig& c, std::vector<float> bias, std::vector<float> logits) {
  const int64_t k = c.num_experts_per_tok, e = c.n_routed_experts;
  Routed r{std::vector<int32_t>(k), std::vector<float>(k)};
  kernels::cpu::CpuBackend cpu;
  cpu.RouterTopk(Tensor(logits.data(), DType::kF32, {1, e}),
                 bias.empty() ? Tensor() : Tensor(bias.data(), DType::kF32, {e}), RouterSpecOf(c),
                 Tensor(r.ids.data(), DType::kI32, {1, k}),
                 Tensor(r.weights.data(), DType::kF32, {1, k}));
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
  const Routed r = Route(c, {}, kLogits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2, 4}));
  const auto p = Softmax(kLogits);
  EXPECT_NEAR(r.weights[1], p[2] * 2.5, 1e-6);  // never renormalised, always scaled
}

TEST(Router, V2GroupLimitedKeepsBestGroupsByMax) {
  const ModelConfig c = SmallMoe(TopkMethod::kGroupLimitedGreedy, 3);
  const Routed r = Route(c, {}, kLogits);
  // Groups 0 and 1 have the largest maxima; the third pick is the tie 1 vs 3 (lower id wins).
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  const auto p = Softmax(kLogits);
  EXPECT_NEAR(r.weights[1], p[1] * 2.5, 1e-7);
}

TEST(Router, V3NoauxTcGroupsByTop2SumBiasSelectsOnly) {
  ModelConfig c = SmallMoe(TopkMethod::kNoauxTc, 2);
  c.norm_topk_prob = true;
  std::vector<float> w(8, 0.0f);
  w[7] = 10.0f;
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

TEST(Router, NaNScoresAreNeverPicked) {
  const ModelConfig c = SmallMoe(TopkMethod::kGreedy, 2);
  std::vector<float> logits = kLogits;
  logits[0] = std::nanf("");
  const Routed r = Route(c, {}, logits);  // softmax of a NaN row is all NaN: lowest ids win
  EXPECT_EQ(r.ids.size(), 2u);
  const ModelConfig v3 = SmallMoe(TopkMethod::kNoauxTc, 2);
  std::vector<float> l3 = {std::nanf(""), 1, 2, 3, 4, 5, 6, 7};
  const Routed r3 = Route(v3, std::vector<float>(8, 0.0f), l3);
  for (int32_t id : r3.ids) EXPECT_NE(id, 0);  // sigmoid(NaN) ranks below every number
}

// The MoE of a model that holds experts [begin, end) of preset:tiny (seed 7).
std::unique_ptr<testing_util::ModelHarness> Part(int64_t begin, int64_t end) {
  OpenOptions o;
  o.preset_seed = 7;
  o.weights.expert_begin = begin;
  o.weights.expert_end = end;
  return std::make_unique<testing_util::ModelHarness>("preset:tiny", o);
}

class ExpertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    full_ = Part(0, -1);
    const ModelConfig& c = full_->model().config();
    std::mt19937 gen(3);
    std::normal_distribution<float> dist;
    hidden_.resize(kTokens * c.hidden_size);
    for (float& v : hidden_) v = dist(gen);
    const int64_t k = c.num_experts_per_tok;
    ids_.resize(kTokens * k);
    weights_k_.resize(kTokens * k);
    Workspace ws(full_->backend());
    full_->model().Route(kLayer, Hidden(), Tensor(ids_.data(), DType::kI32, {kTokens, k}),
                         Tensor(weights_k_.data(), DType::kF32, {kTokens, k}), ws);
  }
  Tensor Hidden() { return Tensor(hidden_.data(), DType::kF32, {kTokens, H()}); }
  int64_t H() const { return full_->model().config().hidden_size; }
  int64_t K() const { return full_->model().config().num_experts_per_tok; }
  std::vector<float> Routed(testing_util::ModelHarness& m) {
    std::vector<float> out(hidden_.size());
    Workspace ws(m.backend());
    m.model().RoutedExperts(kLayer, Hidden(), Tensor(ids_.data(), DType::kI32, {kTokens, K()}),
                            Tensor(weights_k_.data(), DType::kF32, {kTokens, K()}),
                            Tensor(out.data(), DType::kF32, {kTokens, H()}), ws);
    return out;
  }

  static constexpr int64_t kTokens = 9;
  static constexpr int64_t kLayer = 2;
  std::unique_ptr<testing_util::ModelHarness> full_;
  std::vector<float> hidden_, weights_k_;
  std::vector<int32_t> ids_;
};

TEST_F(ExpertsTest, PartialSumsOverExpertRangesAddUp) {
  const int64_t e = full_->model().config().n_routed_experts;
  const std::vector<float> full = Routed(*full_);
  for (int64_t split : {1, 3, 5}) {
    std::vector<float> a = Routed(*Part(0, split)), b = Routed(*Part(split, e));
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_NEAR(a[i] + b[i], full[i], 1e-5 * (1 + std::fabs(full[i]))) << "split " << split;
    }
  }
  // An empty range contributes exact zeros.
  for (float v : Routed(*Part(2, 2))) EXPECT_EQ(v, 0.0f);
}

TEST_F(ExpertsTest, LocalBackendEqualsRoutingComputedElsewhere) {
  LocalMoeBackend backend(full_->model());
  Workspace ws(full_->backend());
  std::vector<float> local(hidden_.size());
  backend.Start(kLayer, 0, Hidden(), Tensor(local.data(), DType::kF32, {kTokens, H()}), ws);
  backend.Finish(0, ws);
  std::vector<float> remote = Routed(*full_);
  full_->model().AddSharedExperts(kLayer, Hidden(),
                                  Tensor(remote.data(), DType::kF32, {kTokens, H()}), ws);
  EXPECT_EQ(local, remote);
}

TEST_F(ExpertsTest, AnExpertRangeComputesOnlyItsExpertsWithTheSameBits) {
  const auto part = Part(2, 6);
  EXPECT_EQ(part->model().weights().layers[kLayer].moe.experts.num_experts(), 4);
  bool uses_unloaded = false;
  for (int32_t id : ids_) uses_unloaded |= id < 2 || id >= 6;
  ASSERT_TRUE(uses_unloaded);  // 9 tokens x 2 picks among 8 experts
  // The range's partial sum, bit for bit, whichever process holds it.
  const auto a = Part(0, 2), b = Part(6, 8);
  std::vector<float> sum_parts(hidden_.size());
  const std::vector<float> pa = Routed(*a), pm = Routed(*part), pb = Routed(*b);
  const std::vector<float> full = Routed(*full_);
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_NEAR(pa[i] + pm[i] + pb[i], full[i], 1e-5 * (1 + std::fabs(full[i])));
  }
}

}  // namespace
}  // namespace afd::model

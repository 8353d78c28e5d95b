#include "afd/model/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "afd/kernels/cpu/linear.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::model {

namespace {

// Indices of the k largest values (ties: lower index first).
std::vector<int32_t> TopK(const std::vector<float>& v, int64_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(k);
  return idx;
}

// Keeps the experts of the `topk_group` best groups; the others get `masked`.
void MaskGroups(const ModelConfig& c, std::vector<float>& scores, bool top2_sum, float masked) {
  const int64_t group_size = c.n_routed_experts / c.n_group;
  std::vector<float> group_scores(c.n_group);
  for (int64_t g = 0; g < c.n_group; ++g) {
    const float* s = scores.data() + g * group_size;
    if (top2_sum && group_size >= 2) {
      float best = -std::numeric_limits<float>::infinity(), second = best;
      for (int64_t e = 0; e < group_size; ++e) {
        if (s[e] > best) {
          second = best;
          best = s[e];
        } else if (s[e] > second) {
          second = s[e];
        }
      }
      group_scores[g] = best + second;
    } else {
      group_scores[g] = top2_sum ? s[0] : *std::max_element(s, s + group_size);
    }
  }
  std::vector<char> keep(c.n_group, 0);
  for (int32_t g : TopK(group_scores, c.topk_group)) keep[g] = 1;
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    if (!keep[e / group_size]) scores[e] = masked;
  }
}

}  // namespace

void RouteTokens(const ModelConfig& config, const MoeWeights& w, const float* hidden, int64_t n,
                 int32_t* topk_ids, float* topk_weights) {
  std::vector<float> logits(n * config.n_routed_experts);  // [n, E]
  kernels::Linear(hidden, n, w.gate, logits.data());
  RouteFromLogits(config, w, logits.data(), n, topk_ids, topk_weights);
}

void RouteFromLogits(const ModelConfig& c, const MoeWeights& w, const float* logits, int64_t n,
                     int32_t* topk_ids, float* topk_weights) {
  const int64_t num_experts = c.n_routed_experts, k = c.num_experts_per_tok;
  std::vector<float> scores(num_experts), choice(num_experts);
  for (int64_t t = 0; t < n; ++t) {
    const float* lt = logits + t * num_experts;
    std::vector<int32_t> ids;
    if (c.scoring_func == ScoringFunc::kSoftmax) {
      std::copy(lt, lt + num_experts, scores.begin());
      kernels::SoftmaxInPlace(scores.data(), num_experts);
      choice = scores;
      if (c.topk_method == TopkMethod::kGroupLimitedGreedy) MaskGroups(c, choice, false, 0.0f);
    } else {
      for (int64_t e = 0; e < num_experts; ++e) {
        scores[e] = 1.0f / (1.0f + std::exp(-lt[e]));
        choice[e] =
            scores[e] + (w.e_score_correction_bias.empty() ? 0.0f : w.e_score_correction_bias[e]);
      }
      MaskGroups(c, choice, true, -std::numeric_limits<float>::infinity());
    }
    ids = TopK(choice, k);
    std::sort(ids.begin(), ids.end());
    float* wt = topk_weights + t * k;
    for (int64_t j = 0; j < k; ++j) {
      topk_ids[t * k + j] = ids[j];
      // V2 keeps the (masked) softmax score, which equals the score for a kept expert.
      wt[j] = scores[ids[j]];
    }
    if (c.scoring_func == ScoringFunc::kSigmoid && c.norm_topk_prob) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += wt[j];
      for (int64_t j = 0; j < k; ++j) wt[j] /= (sum + 1e-20f);
    }
    for (int64_t j = 0; j < k; ++j) wt[j] *= static_cast<float>(c.routed_scaling_factor);
  }
}

}  // namespace afd::model

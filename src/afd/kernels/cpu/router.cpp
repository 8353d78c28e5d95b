#include "afd/kernels/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "afd/kernels/cpu/ops.h"

namespace afd::kernels::cpu {

namespace {

// a ranks before b: larger value first, NaN as -inf, ties to the lower index.
bool Before(float va, int32_t a, float vb, int32_t b) {
  const float x = std::isnan(va) ? -std::numeric_limits<float>::infinity() : va;
  const float y = std::isnan(vb) ? -std::numeric_limits<float>::infinity() : vb;
  return x > y || (x == y && a < b);
}

// Indices of the k largest values.
std::vector<int32_t> TopK(const std::vector<float>& v, int64_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&v](int32_t a, int32_t b) { return Before(v[a], a, v[b], b); });
  idx.resize(k);
  return idx;
}

// Keeps the experts of the `topk_group` best groups; the others get `masked`.
void MaskGroups(const RouterSpec& spec, std::vector<float>& scores, bool top2_sum, float masked) {
  const int64_t num_experts = static_cast<int64_t>(scores.size());
  const int64_t group_size = num_experts / spec.n_group;
  std::vector<float> group_scores(spec.n_group);
  for (int64_t g = 0; g < spec.n_group; ++g) {
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
  std::vector<char> keep(spec.n_group, 0);
  for (int32_t g : TopK(group_scores, spec.topk_group)) keep[g] = 1;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (!keep[e / group_size]) scores[e] = masked;
  }
}

}  // namespace

void RouterTopk(const float* logits, int64_t n, int64_t num_experts, const float* bias,
                const RouterSpec& spec, int32_t* topk_ids, float* topk_weights) {
  const int64_t k = spec.top_k;
  std::vector<float> scores(num_experts), choice(num_experts);
  for (int64_t t = 0; t < n; ++t) {
    const float* lt = logits + t * num_experts;
    if (spec.scoring == RouterScoring::kSoftmax) {
      std::copy(lt, lt + num_experts, scores.begin());
      SoftmaxInPlace(scores.data(), num_experts);
      choice = scores;
      if (spec.group_limited) MaskGroups(spec, choice, false, 0.0f);
    } else {
      for (int64_t e = 0; e < num_experts; ++e) {
        scores[e] = 1.0f / (1.0f + std::exp(-lt[e]));
        choice[e] = scores[e] + (bias == nullptr ? 0.0f : bias[e]);
      }
      MaskGroups(spec, choice, true, -std::numeric_limits<float>::infinity());
    }
    std::vector<int32_t> ids = TopK(choice, k);
    std::sort(ids.begin(), ids.end());
    float* wt = topk_weights + t * k;
    for (int64_t j = 0; j < k; ++j) {
      topk_ids[t * k + j] = ids[j];
      // V2 keeps the (masked) softmax score, which equals the score for a kept expert.
      wt[j] = scores[ids[j]];
    }
    if (spec.norm_topk_prob) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += wt[j];
      for (int64_t j = 0; j < k; ++j) wt[j] /= (sum + spec.norm_eps);
    }
    for (int64_t j = 0; j < k; ++j) wt[j] *= spec.routed_scaling_factor;
  }
}

}  // namespace afd::kernels::cpu

#include "afd/model/experts.h"

#include <algorithm>
#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/linear.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::model {

void MlpForward(const MlpWeights& w, const float* x, int64_t n, float* out) {
  const int64_t inter = w.down.cols();
  std::vector<float> gate_up(n * 2 * inter);  // [n, 2·inter]
  kernels::Linear(x, n, w.gate_up, gate_up.data());
  std::vector<float> act(n * inter);  // [n, inter]
  kernels::SiluMul(gate_up.data(), n, inter, act.data());
  kernels::Linear(act.data(), n, w.down, out);
}

void RoutedExperts(const ModelConfig& config, const MoeWeights& w, const float* hidden, int64_t n,
                   const int32_t* topk_ids, const float* topk_weights, int64_t expert_begin,
                   int64_t expert_end, float* out) {
  const int64_t h = config.hidden_size, k = config.num_experts_per_tok;
  AFD_CHECK(
      0 <= expert_begin && expert_begin <= expert_end && expert_end <= config.n_routed_experts,
      "expert range [{}, {}) outside [0, {})", expert_begin, expert_end, config.n_routed_experts);
  std::fill(out, out + n * h, 0.0f);
  // Tokens (and weights) of each expert in the range, tokens ascending.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(expert_end - expert_begin);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = topk_ids[t * k + j];
      AFD_CHECK(e >= 0 && e < config.n_routed_experts, "token {}: expert id {} out of range", t, e);
      if (e >= expert_begin && e < expert_end) {
        routed[e - expert_begin].emplace_back(t, topk_weights[t * k + j]);
      }
    }
  }
  std::vector<float> x, y;
  for (int64_t e = expert_begin; e < expert_end; ++e) {
    const auto& tokens = routed[e - expert_begin];
    if (tokens.empty()) continue;
    AFD_CHECK(!w.experts[e].empty(), "routed expert {} is not loaded in this process", e);
    const int64_t m = static_cast<int64_t>(tokens.size());
    x.resize(m * h);  // [m, H] gathered rows
    y.resize(m * h);
    for (int64_t r = 0; r < m; ++r) {
      std::copy(hidden + tokens[r].first * h, hidden + (tokens[r].first + 1) * h, x.data() + r * h);
    }
    MlpForward(w.experts[e], x.data(), m, y.data());
    // Ascending e per token: the accumulation order of each token is fixed.
    for (int64_t r = 0; r < m; ++r) {
      float* o = out + tokens[r].first * h;
      const float* yr = y.data() + r * h;
      const float wt = tokens[r].second;
      for (int64_t i = 0; i < h; ++i) o[i] += yr[i] * wt;
    }
  }
}

}  // namespace afd::model

#include "afd/model/moe_backend.h"

#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/ops.h"
#include "afd/model/experts.h"
#include "afd/model/router.h"

namespace afd::model {

void MoeForwardWithRouting(const ModelConfig& config, const MoeWeights& w, const float* hidden,
                           int64_t n, const int32_t* topk_ids, const float* topk_weights,
                           int64_t expert_begin, int64_t expert_end, bool add_shared, float* out) {
  RoutedExperts(config, w, hidden, n, topk_ids, topk_weights, expert_begin, expert_end, out);
  if (add_shared && !w.shared.empty()) {
    std::vector<float> shared(n * config.hidden_size);  // [n, H]
    MlpForward(w.shared, hidden, n, shared.data());
    kernels::AddInPlace(out, shared.data(), n * config.hidden_size);
  }
}

void LocalMoeBackend::Forward(int64_t layer, const float* hidden, int64_t n, float* out) {
  AFD_CHECK(config_.IsMoeLayer(layer) && layer < config_.num_hidden_layers,
            "layer {} is not a MoE layer", layer);
  const MoeWeights& w = weights_.layers[layer].moe;
  const int64_t k = config_.num_experts_per_tok;
  std::vector<int32_t> ids(n * k);  // [n, k]
  std::vector<float> weights(n * k);
  RouteTokens(config_, w, hidden, n, ids.data(), weights.data());
  MoeForwardWithRouting(config_, w, hidden, n, ids.data(), weights.data(), 0,
                        config_.n_routed_experts, true, out);
}

}  // namespace afd::model

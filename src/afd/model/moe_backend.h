// The seam between the attention part of a decoder layer and its MoE part (router, routed
// experts, shared experts). The model calls MoeBackend::Forward for every MoE layer; the local
// implementation runs everything in this process, and the AFD attention role plugs in a backend
// that ships the rows to the FFN role instead.
#pragma once

#include <cstdint>

#include "afd/model/model_config.h"
#include "afd/model/weights.h"

namespace afd::model {

class MoeBackend {
 public:
  virtual ~MoeBackend() = default;
  // hidden: [n, H], the post_attention_layernorm-ed input of MoE layer `layer` (a global layer
  // index with config.IsMoeLayer(layer)). out: [n, H] (overwritten) = routed + shared experts.
  // Rows are independent: a row's output depends only on that row.
  virtual void Forward(int64_t layer, const float* hidden, int64_t n, float* out) = 0;
};

// Router + routed experts [0, E) + shared experts, in process:
//   out = RoutedExperts(RouteTokens(hidden)) + shared(hidden)   (this order, like transformers)
// `config` and `weights` must outlive the backend and hold the router, all routed and the shared
// experts. Thread safety: one Forward at a time.
class LocalMoeBackend : public MoeBackend {
 public:
  LocalMoeBackend(const ModelConfig& config, const ModelWeights& weights)
      : config_(config), weights_(weights) {}
  void Forward(int64_t layer, const float* hidden, int64_t n, float* out) override;

 private:
  const ModelConfig& config_;
  const ModelWeights& weights_;
};

// Given routing computed elsewhere (compute_gate_on_attention): out = routed experts of
// [expert_begin, expert_end) (+ shared experts when add_shared). topk_*: [n, k].
void MoeForwardWithRouting(const ModelConfig& config, const MoeWeights& w, const float* hidden,
                           int64_t n, const int32_t* topk_ids, const float* topk_weights,
                           int64_t expert_begin, int64_t expert_end, bool add_shared, float* out);

}  // namespace afd::model

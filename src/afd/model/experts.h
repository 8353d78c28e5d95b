// Feed-forward pieces: the SwiGLU MLP (dense layers, shared experts, one routed expert) and the
// routed experts of a MoE layer given precomputed routing.
//
// Expert parallelism: RoutedExperts over [begin, end) returns the partial sum of the experts in
// that range. Per token the experts are accumulated in ascending id order starting from 0, so a
// single range [0, E) gives exactly the local result, and summing the partial results of
// consecutive ranges in range order equals it up to fp32 re-association (~1e-7 relative).
// Rows are computed independently (batch-invariant).
#pragma once

#include <cstdint>

#include "afd/model/model_config.h"
#include "afd/model/weights.h"

namespace afd::model {

// out[n, H] = down(silu(gate(x)) · up(x)), x: [n, H].
void MlpForward(const MlpWeights& w, const float* x, int64_t n, float* out);

// out[n, H] (overwritten) = Σ over the slots j of each token with topk_ids[t, j] in
// [expert_begin, expert_end): topk_weights[t, j] · expert_{id}(hidden[t]).
// hidden: [n, H]; topk_ids, topk_weights: [n, k], ids ascending per token (RouteTokens order).
// The experts of the range must be loaded in `w`.
void RoutedExperts(const ModelConfig& config, const MoeWeights& w, const float* hidden, int64_t n,
                   const int32_t* topk_ids, const float* topk_weights, int64_t expert_begin,
                   int64_t expert_end, float* out);

}  // namespace afd::model

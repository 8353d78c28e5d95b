// The MoE router (gate) of one layer, with transformers 5.17 semantics:
//  * V2 (softmax): scores = softmax(h·Wᵀ). greedy: top-k of scores. group_limited_greedy: keep
//    the topk_group groups (of n_group contiguous groups) with the largest max score, zero the
//    others, top-k. Weight = score · routed_scaling_factor (norm_topk_prob is ignored, as
//    transformers' DeepseekV2 does).
//  * V3 (sigmoid + noaux_tc): s = sigmoid(h·Wᵀ), choice = s + e_score_correction_bias; keep the
//    topk_group groups with the largest sum of their top-2 choice scores, others -inf; top-k of
//    choice. Weight = s (unbiased), divided by (Σ + 1e-20) if norm_topk_prob, then always
//    · routed_scaling_factor.
// Ties are broken towards the lower index. Per token, the k selected ids are returned in
// ascending order with their weights. Each token is routed alone (batch-invariant).
#pragma once

#include <cstdint>

#include "afd/model/model_config.h"
#include "afd/model/weights.h"

namespace afd::model {

// hidden: [n, H] (post_attention_layernorm-ed). topk_ids, topk_weights: [n, k] with
// k = config.num_experts_per_tok. `w` needs gate (and the bias for V3).
void RouteTokens(const ModelConfig& config, const MoeWeights& w, const float* hidden, int64_t n,
                 int32_t* topk_ids, float* topk_weights);

// The same from router logits [n, E] (h·Wᵀ), for tests and for callers that computed them.
void RouteFromLogits(const ModelConfig& config, const MoeWeights& w, const float* logits, int64_t n,
                     int32_t* topk_ids, float* topk_weights);

}  // namespace afd::model

// The MoE router (gate) of one layer, with transformers 5.17 semantics:
//  * V2 (softmax): scores = softmax(h·Wᵀ). greedy: top-k of scores. group_limited_greedy: keep
//    the topk_group groups (of n_group contiguous groups) with the largest max score, zero the
//    others, top-k. Weight = score · routed_scaling_factor (norm_topk_prob is ignored, as
//    transformers' DeepseekV2 does).
//  * V3 (sigmoid + noaux_tc): s = sigmoid(h·Wᵀ), choice = s + e_score_correction_bias; keep the
//    topk_group groups with the largest sum of their top-2 choice scores, others -inf; top-k of
//    choice. Weight = s (unbiased), divided by (Σ + 1e-20) if norm_topk_prob, then always
//    · routed_scaling_factor.
//  * Qwen3 (softmax over all experts, greedy top-k): weight = score, divided by Σ (no epsilon)
//    if norm_topk_prob; no scaling factor.
// Ties are broken towards the lower index; NaN scores rank below every number. Per token, the
// k selected ids are returned in ascending order with their weights. Each token is routed
// alone (batch-invariant). The top-k itself is the backend op RouterTopk.
#pragma once

#include "afd/kernels/backend.h"
#include "afd/model/model_config.h"

namespace afd::model {

kernels::RouterSpec RouterSpecOf(const ModelConfig& config);

}  // namespace afd::model

#include "afd/model/router.h"

namespace afd::model {

kernels::RouterSpec RouterSpecOf(const ModelConfig& c) {
  kernels::RouterSpec s;
  s.scoring = c.scoring_func == ScoringFunc::kSoftmax ? kernels::RouterScoring::kSoftmax
                                                      : kernels::RouterScoring::kSigmoid;
  s.group_limited = c.topk_method == TopkMethod::kGroupLimitedGreedy;
  s.top_k = c.num_experts_per_tok;
  s.n_group = c.n_group;
  s.topk_group = c.topk_group;
  // transformers' DeepseekV2 never renormalises; V3 divides by (Σ + 1e-20), Qwen3 by Σ.
  s.norm_topk_prob = c.model_type != ModelType::kDeepseekV2 && c.norm_topk_prob;
  s.norm_eps = c.model_type == ModelType::kQwen3Moe ? 0.0f : 1e-20f;
  s.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  return s;
}

}  // namespace afd::model

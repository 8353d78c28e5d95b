// Router top-k on the CPU, per token (model/router.h documents the semantics of each method).
// NaN scores are never selected over numbers (they compare as -inf); ties go to the lower id.
// Thread safety: pure function.
#pragma once

#include <cstdint>

#include "afd/kernels/backend.h"

namespace afd::kernels::cpu {

// logits: [n, E]; bias: [E] or null. ids: [n, k] ascending per token, weights: [n, k].
void RouterTopk(const float* logits, int64_t n, int64_t num_experts, const float* bias,
                const RouterSpec& spec, int32_t* ids, float* weights);

}  // namespace afd::kernels::cpu

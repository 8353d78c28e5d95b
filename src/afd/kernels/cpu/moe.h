// The MoE pieces on the CPU: permute (group a step's (token, slot) pairs by local expert),
// grouped SwiGLU experts over the grouped rows, weighted combine. Contracts: kernels/backend.h.
// A token's output is accumulated over its slots in ascending j (= ascending expert id, since
// the router returns ids ascending), from zero: the order of transformers' loop over experts.
// Thread safety: reentrant (per-thread scratch).
#pragma once

#include <cstdint>

#include "afd/kernels/backend.h"

namespace afd::kernels::cpu {

void MoePermute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t num_local,
                int32_t* offsets, int32_t* src_row, int32_t* row_of_slot);

// out: [n, H] = down(silu(gate(x)) · up(x)) for x: [n, H], one SwiGLU MLP; gate_up [2I, H].
void SwiGluMlp(const float* x, int64_t n, int64_t hidden, const Tensor& gate_up, const Tensor& down,
               float* out);

void GroupedExpertMlp(const float* x, int64_t hidden, const int32_t* offsets,
                      const ExpertWeights& experts, float* out);

void MoeCombine(const float* y, int64_t hidden, const int32_t* row_of_slot, const float* weights,
                int64_t n, int64_t k, bool accumulate, float* out);

}  // namespace afd::kernels::cpu

// Token selection on the CPU: greedy (argmax, first maximum) or temperature / top-k / top-p
// with the row's uniform draw u (kernels/backend.h SampleRow), and log-softmax at given ids.
// NaN logits: never chosen (they rank below every number); a row of only NaN gives id 0.
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "afd/kernels/backend.h"

namespace afd::kernels::cpu {

int32_t SampleRowIds(const float* logits, int64_t vocab, const SampleRow& row);

// log(sum(exp(logits))) with the sum in double (NaN logits make it NaN).
double LogSumExp(const float* logits, int64_t vocab);
// log_softmax(logits)[id] = logits[id] - LogSumExp(logits), rounded to float.
float LogSoftmaxAtId(const float* logits, int64_t vocab, int32_t id);

}  // namespace afd::kernels::cpu

// Token selection on the CPU: greedy (argmax, first maximum) or temperature / top-k / top-p
// with the row's uniform draw u (kernels/backend.h SampleRow), and log-softmax at given ids.
// NaN logits: never chosen (they rank below every number); a row of only NaN gives id 0.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "afd/kernels/backend.h"

namespace afd::kernels::cpu {

int32_t SampleRowIds(const float* logits, int64_t vocab, const SampleRow& row);

// The k best candidates of a row in sampling order: decreasing logit (NaN as -inf, -0 as +0),
// ties by lower id. A small k takes a partial sort; a large one (top_k 0 keeps the whole
// vocabulary) a stable radix sort on the logits' bits, several times faster at 128k; both give
// the same order (it is a total order), so the choice never changes an id.
std::vector<int32_t> SamplingOrder(const float* logits, int64_t vocab, int64_t k);
// The two orders themselves, for tests.
std::vector<int32_t> SamplingOrderByComparison(const float* logits, int64_t vocab, int64_t k);
std::vector<int32_t> SamplingOrderByRadix(const float* logits, int64_t vocab, int64_t k);

// log(sum(exp(logits))) with the sum in double (NaN logits make it NaN).
double LogSumExp(const float* logits, int64_t vocab);
// log_softmax(logits)[id] = logits[id] - LogSumExp(logits), rounded to float.
float LogSoftmaxAtId(const float* logits, int64_t vocab, int32_t id);

}  // namespace afd::kernels::cpu

#include "afd/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::runtime {

void ValidateSamplingParams(const SamplingParams& p) {
  AFD_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f,
            "temperature must be >= 0, got {}", p.temperature);
  AFD_CHECK(p.top_k >= 0, "top_k must be >= 0 (0: no limit), got {}", p.top_k);
  AFD_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got {}", p.top_p);
}

Sampler::Sampler(const SamplingParams& params, int64_t sequence_index)
    : params_(params),
      rng_(params.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(sequence_index)) {}

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  if (params_.temperature <= 0.0f) return static_cast<int32_t>(kernels::ArgMax(logits, vocab));
  // Candidates by decreasing logit (ties: lower id first), cut to top_k.
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = params_.top_k > 0 ? std::min(params_.top_k, vocab) : vocab;
  auto greater = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), greater);
  ids.resize(k);
  std::vector<double> probs(k);
  const double max = logits[ids[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[ids[i]] - max) / params_.temperature);
    sum += probs[i];
  }
  // top_p: the smallest prefix whose probability reaches top_p.
  int64_t keep = k;
  double cumulative = 0.0, kept_sum = sum;
  for (int64_t i = 0; i < k; ++i) {
    cumulative += probs[i] / sum;
    if (cumulative >= params_.top_p) {
      keep = i + 1;
      kept_sum = 0.0;
      for (int64_t j = 0; j < keep; ++j) kept_sum += probs[j];
      break;
    }
  }
  // u in [0, 1) from 53 random bits (std distributions differ between standard libraries).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept_sum;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace afd::runtime

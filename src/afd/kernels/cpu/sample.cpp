#include "afd/kernels/cpu/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace afd::kernels::cpu {

namespace {

float Key(float v) { return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v; }

}  // namespace

int32_t SampleRowIds(const float* logits, int64_t vocab, const SampleRow& row) {
  if (row.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i) {
      if (Key(logits[i]) > Key(logits[best])) best = i;
    }
    return static_cast<int32_t>(best);
  }
  // Candidates by decreasing logit (ties: lower id first), cut to top_k.
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = row.top_k > 0 ? std::min(row.top_k, vocab) : vocab;
  auto greater = [logits](int32_t a, int32_t b) {
    return Key(logits[a]) > Key(logits[b]) || (Key(logits[a]) == Key(logits[b]) && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), greater);
  ids.resize(k);
  const double max = Key(logits[ids[0]]);
  if (!std::isfinite(max)) return ids[0];  // nothing finite to sample from
  std::vector<double> probs(k);
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    probs[i] = std::exp((Key(logits[ids[i]]) - max) / row.temperature);
    sum += probs[i];
  }
  // top_p: the smallest prefix whose probability reaches top_p.
  int64_t keep = k;
  double cumulative = 0.0, kept_sum = sum;
  for (int64_t i = 0; i < k; ++i) {
    cumulative += probs[i] / sum;
    if (cumulative >= row.top_p) {
      keep = i + 1;
      kept_sum = 0.0;
      for (int64_t j = 0; j < keep; ++j) kept_sum += probs[j];
      break;
    }
  }
  const double u = row.u * kept_sum;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

double LogSumExp(const float* x, int64_t count) {
  float max = x[0];
  for (int64_t i = 1; i < count; ++i) max = std::fmax(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  return std::log(sum) + max;
}

float LogSoftmaxAtId(const float* x, int64_t count, int32_t id) {
  return static_cast<float>(x[id] - LogSumExp(x, count));
}

}  // namespace afd::kernels::cpu

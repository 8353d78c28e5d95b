#include "afd/kernels/cpu/sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace afd::kernels::cpu {

namespace {

float Key(float v) { return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v; }

// A float's bits mapped so that unsigned order is the float order (after Key; -0 as +0): the
// sign bit flipped for positives, every bit for negatives. Inverted, so ascending = decreasing.
uint32_t DescendingBits(float v) {
  float k = Key(v);
  if (k == 0.0f) k = 0.0f;  // -0 == +0 in the comparison order
  uint32_t u;
  std::memcpy(&u, &k, sizeof(u));
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~u;
}

}  // namespace

std::vector<int32_t> SamplingOrderByComparison(const float* logits, int64_t vocab, int64_t k) {
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  auto greater = [logits](int32_t a, int32_t b) {
    return Key(logits[a]) > Key(logits[b]) || (Key(logits[a]) == Key(logits[b]) && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), greater);
  ids.resize(k);
  return ids;
}

std::vector<int32_t> SamplingOrderByRadix(const float* logits, int64_t vocab, int64_t k) {
  // LSD radix sort, 11 + 11 + 10 bits, stable: ids start ascending, so equal keys stay so.
  std::vector<uint32_t> keys(vocab), keys_tmp(vocab);
  std::vector<int32_t> ids(vocab), ids_tmp(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    keys[i] = DescendingBits(logits[i]);
    ids[i] = static_cast<int32_t>(i);
  }
  constexpr int kShifts[3] = {0, 11, 22};
  constexpr uint32_t kMasks[3] = {0x7ffu, 0x7ffu, 0x3ffu};
  std::vector<int64_t> count(2048);
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShifts[pass];
    const uint32_t mask = kMasks[pass];
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < vocab; ++i) ++count[(keys[i] >> shift) & mask];
    int64_t offset = 0;
    for (auto& c : count) {
      const int64_t n = c;
      c = offset;
      offset += n;
    }
    for (int64_t i = 0; i < vocab; ++i) {
      const int64_t at = count[(keys[i] >> shift) & mask]++;
      keys_tmp[at] = keys[i];
      ids_tmp[at] = ids[i];
    }
    keys.swap(keys_tmp);
    ids.swap(ids_tmp);
  }
  ids.resize(k);
  return ids;
}

std::vector<int32_t> SamplingOrder(const float* logits, int64_t vocab, int64_t k) {
  // partial_sort costs ~vocab * log2(k) comparisons, the radix sort ~6 passes over the row.
  if (k * 64 <= vocab) return SamplingOrderByComparison(logits, vocab, k);
  return SamplingOrderByRadix(logits, vocab, k);
}

int32_t SampleRowIds(const float* logits, int64_t vocab, const SampleRow& row) {
  if (row.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i) {
      if (Key(logits[i]) > Key(logits[best])) best = i;
    }
    return static_cast<int32_t>(best);
  }
  // Candidates by decreasing logit (ties: lower id first), cut to top_k.
  const int64_t k = row.top_k > 0 ? std::min(row.top_k, vocab) : vocab;
  const std::vector<int32_t> ids = SamplingOrder(logits, vocab, k);
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

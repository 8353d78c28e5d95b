// Sampling parameters and each sequence's random stream. The choice of a token is the
// backend's Sample op (greedy: argmax, first maximum; else temperature, top-k, top-p) given the
// row's uniform draw u, which comes from the sequence's Sampler: its stream depends only on
// (seed, sequence index), so results do not depend on batching.
#pragma once

#include <cstdint>
#include <random>

#include "afd/kernels/backend.h"

namespace afd::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int64_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;
};

// Throws afd::Error for out-of-range parameters.
void ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  Sampler(const SamplingParams& params, int64_t sequence_index);
  // The next row's parameters; draws from the stream only when sampling (not greedy).
  kernels::SampleRow NextRow();

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace afd::runtime

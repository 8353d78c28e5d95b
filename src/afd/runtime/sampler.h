// Picking the next token from a row of logits: greedy (temperature <= 0: argmax, first maximum
// wins) or sampling with temperature, top-k and top-p. Each sequence owns a Sampler whose random
// stream depends only on (seed, sequence index), so results do not depend on batching.
#pragma once

#include <cstdint>
#include <random>

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
  // Returns a token id in [0, vocab).
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace afd::runtime

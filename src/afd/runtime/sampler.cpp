#include "afd/runtime/sampler.h"

#include <cmath>

#include "afd/common/error.h"

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

kernels::SampleRow Sampler::NextRow() {
  kernels::SampleRow row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  if (params_.temperature > 0.0f) {
    // u in [0, 1) from 53 random bits (std distributions differ between standard libraries).
    row.u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  }
  return row;
}

}  // namespace afd::runtime

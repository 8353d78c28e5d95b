// Rotary position embedding of the rotated dims dr (ModelConfig::rope_dim: MLA's
// qk_rope_head_dim, all of a GQA head_dim), default or YaRN, with the transformers 5.17
// semantics (docs/model.md):
//  * inv_freq[i] = 1 / theta^(2i/dr) (fp32); YaRN blends extrapolated and interpolated
//    frequencies with a linear ramp over [low, high] from beta_fast / beta_slow.
//  * cos and sin are multiplied by attention_factor (YaRN: mscale(f, mscale) /
//    mscale(f, mscale_all_dim), or rope_parameters["attention_factor"]).
//  * The softmax scale is score_head_dim^-0.5 (MLA: dn+dr; GQA: d), for MLA with YaRN times
//    mscale(f, mscale_all_dim)² (DeepSeek's attention; Qwen3's does not).
// Pairing: interleaved rotates (x[2i], x[2i+1]) by angle pos·inv_freq[i] (V2, and V3 with
// rope_interleave; V3 then stores the result de-interleaved, which leaves every q·k product
// unchanged, so this runtime keeps the interleaved layout); otherwise (x[i], x[i + dr/2]).
// The rotation itself is a backend op (kernels/backend.h Rope, MlaCacheWrite).
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <vector>

#include "afd/model/model_config.h"

namespace afd::model {

class Rope {
 public:
  explicit Rope(const ModelConfig& config);

  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float attention_factor() const { return attention_factor_; }
  float softmax_scale() const { return softmax_scale_; }
  bool interleave() const { return interleave_; }

 private:
  int64_t dim_;
  bool interleave_;
  std::vector<float> inv_freq_;  // [dr/2]
  float attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
};

// YaRN's mscale: 1 for factor <= 1, else 0.1·m·ln(factor) + 1.
double YarnMscale(double factor, double m);

}  // namespace afd::model

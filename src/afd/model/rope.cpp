#include "afd/model/rope.h"

#include <algorithm>
#include <cmath>

namespace afd::model {

double YarnMscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

Rope::Rope(const ModelConfig& config)
    : dim_(config.rope_dim()), interleave_(config.rope_interleave) {
  const RopeConfig& r = config.rope;
  const int64_t half = dim_ / 2;
  const float base = static_cast<float>(r.theta);
  std::vector<float> pos_freqs(half);  // base^(2i/dr), fp32 like torch
  for (int64_t i = 0; i < half; ++i) {
    pos_freqs[i] = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim_));
  }
  inv_freq_.resize(half);
  softmax_scale_ =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.score_head_dim())));
  if (r.type == RopeType::kDefault) {
    for (int64_t i = 0; i < half; ++i) inv_freq_[i] = 1.0f / pos_freqs[i];
    return;
  }
  // YaRN.
  const double factor = r.factor;
  auto correction_dim = [&](double rotations) {
    return (dim_ * std::log(r.original_max_position_embeddings / (rotations * 2 * M_PI))) /
           (2 * std::log(r.theta));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim_ - 1));
  if (low == high) high += 0.001;
  const float f_factor = static_cast<float>(factor);
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    const float extra = 1.0f / pos_freqs[i];
    const float inter = 1.0f / (f_factor * pos_freqs[i]);
    inv_freq_[i] = inter * (1.0f - extrapolation_weight) + extra * extrapolation_weight;
  }
  if (r.attention_factor != 0.0) {
    attention_factor_ = static_cast<float>(r.attention_factor);
  } else if (r.mscale != 0.0 && r.mscale_all_dim != 0.0) {
    attention_factor_ =
        static_cast<float>(YarnMscale(factor, r.mscale) / YarnMscale(factor, r.mscale_all_dim));
  } else {
    attention_factor_ = static_cast<float>(YarnMscale(factor, 1.0));
  }
  // DeepSeek's attention scales its softmax by mscale(f, mscale_all_dim)²; Qwen3's keeps d^-0.5.
  if (r.mscale_all_dim != 0.0 && config.attention() == AttentionKind::kMla) {
    const double m = YarnMscale(factor, r.mscale_all_dim);
    softmax_scale_ = static_cast<float>(softmax_scale_ * m * m);
  }
}

}  // namespace afd::model

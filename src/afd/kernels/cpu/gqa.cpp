#include "afd/kernels/cpu/gqa.h"

#include <algorithm>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::kernels::cpu {

void GqaCacheWrite(const float* qkv, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                   const float* q_norm, const float* k_norm, float eps, const PagedTokens& tokens,
                   const RopeParams& rope, float* q, void* cache, bool bf16_cache) {
  const int64_t in_width = (heads + 2 * kvh) * d, width = 2 * kvh * d;
  std::vector<float> staged(bf16_cache ? width : 0);
  for (int64_t i = 0; i < n; ++i) {
    const float* src = qkv + i * in_width;
    const int64_t pos = tokens.positions[i];
    float* qi = q + i * heads * d;
    RmsNorm(src, heads, d, q_norm, eps, qi);
    ApplyRope(rope, qi, heads, d, pos);
    const int64_t slot = tokens.slot_mapping[i];
    if (slot < 0) continue;  // a padding row: no cache row
    float* row = bf16_cache ? staged.data() : static_cast<float*>(cache) + slot * width;
    RmsNorm(src + heads * d, kvh, d, k_norm, eps, row);
    ApplyRope(rope, row, kvh, d, pos);
    std::copy(src + (heads + kvh) * d, src + in_width, row + kvh * d);
    if (bf16_cache) {
      uint16_t* out = static_cast<uint16_t*>(cache) + slot * width;
      for (int64_t j = 0; j < width; ++j) out[j] = F32ToBf16(row[j]);
    }
  }
}

void GqaAttention(const float* q, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                  const PagedTokens& tokens, const void* cache, bool bf16_cache, int64_t h0,
                  int64_t h1, float scale, float* out) {
  const int64_t width = 2 * kvh * d, group = heads / kvh, nh = h1 - h0;
  std::vector<float> scores, widened;
  std::vector<const float*> rows;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t seq = tokens.seq_index[i];
    const int64_t len = tokens.positions[i] + 1;  // causal: positions 0..pos
    rows.resize(len);
    for (int64_t j = 0; j < len; ++j) {
      const int32_t block = tokens.block_tables[seq * tokens.max_blocks + j / tokens.block_size];
      const int64_t slot = static_cast<int64_t>(block) * tokens.block_size + j % tokens.block_size;
      if (bf16_cache) {  // widened to f32 (exact), then as for an f32 cache
        widened.resize(len * width);
        const uint16_t* src = static_cast<const uint16_t*>(cache) + slot * width;
        for (int64_t c = 0; c < width; ++c) widened[j * width + c] = Bf16ToF32(src[c]);
      } else {
        rows[j] = static_cast<const float*>(cache) + slot * width;
      }
    }
    if (bf16_cache) {
      for (int64_t j = 0; j < len; ++j) rows[j] = widened.data() + j * width;
    }
    scores.resize(len);
    for (int64_t h = h0; h < h1; ++h) {
      const float* qh = q + (i * heads + h) * d;
      const int64_t k_off = (h / group) * d, v_off = (kvh + h / group) * d;
      for (int64_t j = 0; j < len; ++j) scores[j] = Dot(qh, rows[j] + k_off, d) * scale;
      SoftmaxInPlace(scores.data(), len);
      float* o = out + (i * nh + (h - h0)) * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t j = 0; j < len; ++j) AxpyInPlace(o, scores[j], rows[j] + v_off, d);
    }
  }
}

}  // namespace afd::kernels::cpu

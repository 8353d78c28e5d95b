#include "afd/kernels/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::kernels::cpu {

namespace {

int64_t SlotOf(const PagedTokens& t, int32_t seq, int64_t pos) {
  const int32_t block = t.block_tables[seq * t.max_blocks + pos / t.block_size];
  return static_cast<int64_t>(block) * t.block_size + pos % t.block_size;
}

}  // namespace

void ApplyRope(const RopeParams& rope, float* x, int64_t count, int64_t stride, int64_t pos) {
  const int64_t half = rope.dim / 2;
  float cos_v[256], sin_v[256];  // dr <= 512 is checked by ModelConfig::Validate
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * rope.inv_freq[i];
    cos_v[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * rope.attention_factor;
    sin_v[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * rope.attention_factor;
  }
  for (int64_t v = 0; v < count; ++v) {
    float* y = x + v * stride;
    for (int64_t i = 0; i < half; ++i) {
      float* a = rope.interleave ? &y[2 * i] : &y[i];
      float* b = rope.interleave ? &y[2 * i + 1] : &y[i + half];
      const float x1 = *a, x2 = *b;
      *a = x1 * cos_v[i] - x2 * sin_v[i];
      *b = x2 * cos_v[i] + x1 * sin_v[i];
    }
  }
}

void MlaCacheWrite(const float* ckv, int64_t n, int64_t kvr, const float* norm_w, float eps,
                   const PagedTokens& tokens, const RopeParams& rope, void* cache,
                   bool bf16_cache) {
  const int64_t dr = rope.dim, width = kvr + dr;
  std::vector<float> staged(bf16_cache ? width : 0);
  for (int64_t i = 0; i < n; ++i) {
    if (tokens.slot_mapping[i] < 0) continue;  // a padding row: nothing to write
    const int64_t slot = tokens.slot_mapping[i];
    float* row = bf16_cache ? staged.data() : static_cast<float*>(cache) + slot * width;
    const float* src = ckv + i * width;
    RmsNorm(src, 1, kvr, norm_w, eps, row);
    std::copy(src + kvr, src + width, row + kvr);
    ApplyRope(rope, row + kvr, 1, dr, tokens.positions[i]);
    if (bf16_cache) {
      uint16_t* out = static_cast<uint16_t*>(cache) + slot * width;
      for (int64_t j = 0; j < width; ++j) out[j] = F32ToBf16(row[j]);
    }
  }
}

void MlaAttention(const float* q, int64_t n, int64_t heads, const float* kv_b, int64_t kvr,
                  int64_t dn, int64_t dr, int64_t dv, const PagedTokens& tokens, const void* cache,
                  bool bf16_cache, int64_t h0, int64_t h1, float scale, float* out) {
  const int64_t qk = dn + dr, width = kvr + dr, nh = h1 - h0;
  std::vector<float> q_lat(kvr), o_lat(kvr), scores, widened;
  std::vector<const float*> rows;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t seq = tokens.seq_index[i];
    const int64_t len = tokens.positions[i] + 1;  // causal: positions 0..pos
    rows.resize(len);
    if (bf16_cache) {  // the token's rows widened to f32 (exact), then as for an f32 cache
      widened.resize(len * width);
      for (int64_t j = 0; j < len; ++j) {
        const uint16_t* src = static_cast<const uint16_t*>(cache) + SlotOf(tokens, seq, j) * width;
        for (int64_t c = 0; c < width; ++c) widened[j * width + c] = Bf16ToF32(src[c]);
        rows[j] = widened.data() + j * width;
      }
    } else {
      for (int64_t j = 0; j < len; ++j) {
        rows[j] = static_cast<const float*>(cache) + SlotOf(tokens, seq, j) * width;
      }
    }
    scores.resize(len);
    for (int64_t h = h0; h < h1; ++h) {
      const float* qh = q + (i * heads + h) * qk;
      const float* w_k = kv_b + h * (dn + dv) * kvr;  // [dn, kv_lora]
      const float* w_v = w_k + dn * kvr;              // [dv, kv_lora]
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      for (int64_t d = 0; d < dn; ++d) AxpyInPlace(q_lat.data(), qh[d], w_k + d * kvr, kvr);
      for (int64_t j = 0; j < len; ++j) {
        scores[j] = (Dot(q_lat.data(), rows[j], kvr) + Dot(qh + dn, rows[j] + kvr, dr)) * scale;
      }
      SoftmaxInPlace(scores.data(), len);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int64_t j = 0; j < len; ++j) AxpyInPlace(o_lat.data(), scores[j], rows[j], kvr);
      float* out_h = out + (i * nh + (h - h0)) * dv;
      for (int64_t e = 0; e < dv; ++e) out_h[e] = Dot(w_v + e * kvr, o_lat.data(), kvr);
    }
  }
}

}  // namespace afd::kernels::cpu

#include "afd/model/attention.h"

#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/linear.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::model {

namespace {
// q_a_layernorm and kv_a_layernorm are built with the RMSNorm class default eps in
// transformers, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;
}  // namespace

void MlaAttention::Forward(const AttentionWeights& w, int64_t layer, const float* x,
                           const ForwardBatch& batch, MlaKvCache& cache, float* out) const {
  const int64_t n = batch.size(), nh = c_.num_attention_heads;
  WriteCache(w, layer, x, batch, cache);
  std::vector<float> q(n * nh * c_.qk_head_dim());  // [n, nH, dn + dr]
  ProjectQuery(w, x, batch, 0, nh, q.data());
  std::vector<float> heads(n * nh * c_.v_head_dim);  // [n, nH·dv]
  AttendHeads(w, layer, q.data(), batch, cache, 0, nh, heads.data());
  kernels::Linear(heads.data(), n, w.o_proj, out);
}

void MlaAttention::WriteCache(const AttentionWeights& w, int64_t layer, const float* x,
                              const ForwardBatch& batch, MlaKvCache& cache) const {
  const int64_t n = batch.size(), kvr = c_.kv_lora_rank, dr = c_.qk_rope_head_dim;
  std::vector<float> ckv(n * (kvr + dr));  // [n, kv_lora + dr]
  kernels::Linear(x, n, w.kv_a_proj, ckv.data());
  for (int64_t i = 0; i < n; ++i) {
    float* row = cache.Row(layer, batch.seq_slots[i], batch.positions[i]);
    const float* src = ckv.data() + i * (kvr + dr);
    kernels::RmsNorm(src, 1, kvr, w.kv_a_norm.data(), kLatentNormEps, row);
    std::copy(src + kvr, src + kvr + dr, row + kvr);
    rope_.Apply(row + kvr, 1, dr, batch.positions[i]);
  }
}

void MlaAttention::ProjectQuery(const AttentionWeights& w, const float* x,
                                const ForwardBatch& batch, int64_t h0, int64_t h1, float* q) const {
  const int64_t n = batch.size(), qk = c_.qk_head_dim();
  AFD_CHECK(0 <= h0 && h0 < h1 && h1 <= c_.num_attention_heads, "heads [{}, {}) out of {}", h0, h1,
            c_.num_attention_heads);
  if (c_.q_lora_rank == 0) {
    kernels::Linear(x, n, w.q_proj.RowSlice(h0 * qk, (h1 - h0) * qk), q);
  } else {
    std::vector<float> qa(n * c_.q_lora_rank);  // [n, q_lora]
    kernels::Linear(x, n, w.q_a_proj, qa.data());
    kernels::RmsNorm(qa.data(), n, c_.q_lora_rank, w.q_a_norm.data(), kLatentNormEps, qa.data());
    kernels::Linear(qa.data(), n, w.q_b_proj.RowSlice(h0 * qk, (h1 - h0) * qk), q);
  }
  for (int64_t i = 0; i < n; ++i) {
    rope_.Apply(q + i * (h1 - h0) * qk + c_.qk_nope_head_dim, h1 - h0, qk, batch.positions[i]);
  }
}

void MlaAttention::AttendHeads(const AttentionWeights& w, int64_t layer, const float* q,
                               const ForwardBatch& batch, const MlaKvCache& cache, int64_t h0,
                               int64_t h1, float* out) const {
  const int64_t n = batch.size(), kvr = c_.kv_lora_rank, dn = c_.qk_nope_head_dim;
  const int64_t dr = c_.qk_rope_head_dim, dv = c_.v_head_dim, qk = dn + dr;
  const int64_t width = cache.row_width();
  const float* kv_b = w.kv_b_proj.f32();  // [nH·(dn+dv), kv_lora]
  const float scale = rope_.softmax_scale();
  std::vector<float> q_lat(kvr), o_lat(kvr), scores;
  for (int64_t i = 0; i < n; ++i) {
    const int seq = batch.seq_slots[i];
    const int64_t len = batch.positions[i] + 1;    // causal: positions 0..pos
    const float* rows = cache.Row(layer, seq, 0);  // [capacity, width], contiguous
    scores.resize(len);
    for (int64_t h = h0; h < h1; ++h) {
      const float* qh = q + (i * (h1 - h0) + (h - h0)) * qk;
      const float* w_k = kv_b + h * (dn + dv) * kvr;  // [dn, kv_lora]
      const float* w_v = w_k + dn * kvr;              // [dv, kv_lora]
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      for (int64_t d = 0; d < dn; ++d)
        kernels::AxpyInPlace(q_lat.data(), qh[d], w_k + d * kvr, kvr);
      for (int64_t j = 0; j < len; ++j) {
        const float* row = rows + j * width;
        scores[j] =
            (kernels::Dot(q_lat.data(), row, kvr) + kernels::Dot(qh + dn, row + kvr, dr)) * scale;
      }
      kernels::SoftmaxInPlace(scores.data(), len);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int64_t j = 0; j < len; ++j) {
        kernels::AxpyInPlace(o_lat.data(), scores[j], rows + j * width, kvr);
      }
      float* out_h = out + (i * (h1 - h0) + (h - h0)) * dv;
      for (int64_t e = 0; e < dv; ++e) out_h[e] = kernels::Dot(w_v + e * kvr, o_lat.data(), kvr);
    }
  }
}

}  // namespace afd::model

// The attention layers of MoeModel. GQA (Qwen3): q, k, v = x·W_qkvᵀ, per-head RMSNorm of q and
// k (q_norm, k_norm over head_dim), rope over all of head_dim, k and v cached per KV head, head
// h attending with KV head h / (nH / nKV), scale head_dim^-0.5.
// MLA (DeepSeek), in the "absorbed" form that works directly on the latent cache. For head h,
// with W_k[h] = kv_b_proj rows of its dn key dims and W_v[h] those of its dv value dims (both
// [*, kv_lora]):
//   q_lat = W_k[h]ᵀ · q_nope                       [kv_lora]
//   score_j = (q_lat · c_j + q_pe · k_pe_j) · scale, softmax over j = 0..pos (causal)
//   o_lat = Σ_j p_j · c_j                          [kv_lora]
//   out_h = W_v[h] · o_lat                         [dv]
// which equals transformers' expanded form (k_nope_j = W_k[h]·c_j, v_j = W_v[h]·c_j) up to
// fp32 rounding. Both kinds project q for all heads whatever the head range (a GEMM over a slice of
// the weight rows is the same chain per element here, but projecting all keeps one code path),
// so attention tensor parallelism gives exactly the results of one rank.
#include "afd/common/error.h"
#include "afd/model/model.h"

namespace afd::model {

namespace {
// q_a_layernorm and kv_a_layernorm are built with the RMSNorm class default eps in
// transformers, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;
}  // namespace

void MoeModel::Attention(int64_t layer, const StepInputs& in, kv::PagedKvCache& cache,
                         const Tensor& x, const Tensor& mlp_in, Workspace& ws, HeadParallel* tp,
                         const Tensor* pending) const {
  const ModelConfig& c = config_;
  const AttentionWeights& w = weights_.layers[layer].attn;
  const int64_t n = in.n, h = c.hidden_size, nh = c.num_attention_heads;
  const int64_t dv = c.value_head_dim();
  const int64_t h0 = tp ? tp->head_begin() : 0, h1 = tp ? tp->head_end() : nh;
  AFD_CHECK(0 <= h0 && h0 < h1 && h1 <= nh, "heads [{}, {}) out of {}", h0, h1, nh);
  const Tensor normed = ws.Take(DType::kF32, {n, h});
  if (pending != nullptr) {
    backend_.AddRmsNorm(x, *pending, w.input_norm, c.rms_norm_eps, normed);
  } else {
    backend_.RmsNorm(x, w.input_norm, c.rms_norm_eps, normed);
  }
  const Tensor mine = ws.Take(DType::kF32, {n, (h1 - h0) * dv});
  if (c.attention() == AttentionKind::kGqa) {
    GqaAttention(layer, in, cache, normed, mine, h0, h1, ws);
  } else {
    MlaAttention(layer, in, cache, normed, mine, h0, h1, ws);
  }
  Tensor heads = mine;
  if (tp != nullptr) {
    heads = ws.Take(DType::kF32, {n, nh * dv});
    tp->AllGatherHeads(mine, heads);
  }
  const Tensor out = ws.Take(DType::kF32, {n, h});
  backend_.Linear(heads, w.o_proj, out);
  backend_.AddRmsNorm(x, out, weights_.layers[layer].post_attention_norm, c.rms_norm_eps, mlp_in);
}

void MoeModel::MlaAttention(int64_t layer, const StepInputs& in, kv::PagedKvCache& cache,
                            const Tensor& normed, const Tensor& heads_out, int64_t h0, int64_t h1,
                            Workspace& ws) const {
  const ModelConfig& c = config_;
  const AttentionWeights& w = weights_.layers[layer].attn;
  const int64_t n = in.n, nh = c.num_attention_heads;
  const int64_t kvr = c.kv_lora_rank, dr = c.qk_rope_head_dim, qk = c.qk_head_dim();
  // Cache rows of this layer for the step's tokens: c = kv_a_layernorm(x·W_kv_aᵀ[:kv_lora]),
  // k_pe = rope(x·W_kv_aᵀ[kv_lora:]).
  // (Beside the q projection: both only read `normed`.)
  const Tensor ckv = ws.Take(DType::kF32, {n, kvr + dr});
  kernels::AttentionTokens tokens = in.attn;
  tokens.block_size = cache.block_size();
  backend_.Beside(
      [&] {
        backend_.Linear(normed, w.kv_a_proj, ckv);
        backend_.MlaCacheWrite(ckv, w.kv_a_norm, kLatentNormEps, tokens, rope_spec_,
                               cache.Layer(layer));
      },
      n);
  // q of all heads: [n, nH, dn + dr], rope on the last dr dims of each head.
  const Tensor q = ws.Take(DType::kF32, {n, nh, qk});
  const Tensor q2 = q.Reshape({n, nh * qk});
  if (c.q_lora_rank == 0) {
    backend_.Linear(normed, w.q_proj, q2);
  } else {
    const Tensor qa = ws.Take(DType::kF32, {n, c.q_lora_rank});
    backend_.Linear(normed, w.q_a_proj, qa);
    backend_.RmsNorm(qa, w.q_a_norm, kLatentNormEps, qa);
    backend_.Linear(qa, w.q_b_proj, q2);
  }
  backend_.Rope(q, c.qk_nope_head_dim, in.attn.positions, rope_spec_);
  backend_.JoinBeside();  // the cache rows of this step are written
  backend_.MlaAttention(q, w.kv_b_proj, tokens, cache.Layer(layer), h0, h1, c.qk_nope_head_dim,
                        c.v_head_dim, rope_.softmax_scale(), heads_out);
}

void MoeModel::GqaAttention(int64_t layer, const StepInputs& in, kv::PagedKvCache& cache,
                            const Tensor& normed, const Tensor& heads_out, int64_t h0, int64_t h1,
                            Workspace& ws) const {
  const ModelConfig& c = config_;
  const AttentionWeights& w = weights_.layers[layer].attn;
  const int64_t n = in.n, nh = c.num_attention_heads, kvh = c.num_key_value_heads;
  const int64_t d = c.head_dim;
  // q, k, v of every head in one GEMM; then q_norm / k_norm and the rope, the cache rows of
  // the step's tokens written, q kept for the attention.
  const Tensor qkv = ws.Take(DType::kF32, {n, (nh + 2 * kvh) * d});
  backend_.Linear(normed, w.qkv_proj, qkv);
  kernels::AttentionTokens tokens = in.attn;
  tokens.block_size = cache.block_size();
  const Tensor q = ws.Take(DType::kF32, {n, nh, d});
  backend_.GqaCacheWrite(qkv, w.q_norm, w.k_norm, c.rms_norm_eps, tokens, rope_spec_, q,
                         cache.Layer(layer));
  backend_.GqaAttention(q, tokens, cache.Layer(layer), kvh, h0, h1, rope_.softmax_scale(),
                        heads_out);
}

}  // namespace afd::model

#include <algorithm>

#include "afd/common/error.h"
#include "afd/kernels/cpu/linear.h"
#include "afd/kernels/cpu/ops.h"
#include "afd/model/router.h"
#include "afd/runtime/attention_runner.h"

// The layers of one step on the attention rank: attention with TP, dense MLPs, and the MoE
// exchange with the FFN role in one stage or as two pipelined micro-batches (DBO).
namespace afd::runtime {

namespace {

// Connector channels of a MoE layer's rows.
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;

}  // namespace

void AttentionRunner::AttentionLayer(int64_t layer, const model::ForwardBatch& batch,
                                     model::MlaKvCache& cache, float* x, float* mlp_in) {
  const model::ModelConfig& c = model_.config();
  if (tp_ == 1) {
    model_.AttentionStep(layer, batch, cache, x, mlp_in);
    return;
  }
  // The steps of DeepseekModel::AttentionStep, with the heads split over the TP ranks.
  const int64_t n = batch.size(), H = c.hidden_size, dv = c.v_head_dim;
  const int64_t heads = c.num_attention_heads, my_heads = head_end_ - head_begin_;
  const model::LayerWeights& lw = model_.weights().layers[layer];
  const model::MlaAttention& attn = model_.attention();
  std::vector<float> normed(n * H);  // [n, H]
  kernels::RmsNorm(x, n, H, lw.attn.input_norm.data(), c.rms_norm_eps, normed.data());
  attn.WriteCache(lw.attn, layer, normed.data(), batch, cache);
  // The query projection of all heads, then this rank's heads: a GEMM over a slice of the
  // weight rows may round differently from the full one, and TP must not change the results.
  const int64_t qk = c.qk_head_dim();
  std::vector<float> q_all(n * heads * qk);  // [n, heads, dn + dr]
  attn.ProjectQuery(lw.attn, normed.data(), batch, 0, heads, q_all.data());
  std::vector<float> q(n * my_heads * qk);  // [n, my_heads, dn + dr]
  for (int64_t t = 0; t < n; ++t) {
    std::copy(q_all.begin() + (t * heads + head_begin_) * qk,
              q_all.begin() + (t * heads + head_end_) * qk, q.begin() + t * my_heads * qk);
  }
  std::vector<float> mine(n * my_heads * dv);  // [n, my_heads·dv]
  attn.AttendHeads(lw.attn, layer, q.data(), batch, cache, head_begin_, head_end_, mine.data());
  // All-gather the head outputs: every rank sends its block to every rank.
  std::vector<float> send(tp_ * mine.size());
  for (int p = 0; p < tp_; ++p) std::copy(mine.begin(), mine.end(), send.begin() + p * mine.size());
  std::vector<size_t> send_counts(tp_, mine.size()), recv_counts(tp_);
  int64_t total = 0;
  for (int p = 0; p < tp_; ++p) {
    recv_counts[p] = n * (SplitOffset(heads, tp_, p + 1) - SplitOffset(heads, tp_, p)) * dv;
    total += recv_counts[p];
  }
  std::vector<float> blocks(total);  // rank p's block: [n, heads_p·dv]
  tp_group_->AllToAllV(send.data(), send_counts, blocks.data(), recv_counts, DType::kF32);
  std::vector<float> all_heads(n * heads * dv);  // [n, heads·dv], heads in order
  int64_t offset = 0;
  for (int p = 0; p < tp_; ++p) {
    const int64_t width = (SplitOffset(heads, tp_, p + 1) - SplitOffset(heads, tp_, p)) * dv;
    const int64_t col = SplitOffset(heads, tp_, p) * dv;
    for (int64_t t = 0; t < n; ++t) {
      std::copy(blocks.begin() + offset + t * width, blocks.begin() + offset + (t + 1) * width,
                all_heads.begin() + t * heads * dv + col);
    }
    offset += n * width;
  }
  std::vector<float> out(n * H);  // [n, H]
  kernels::Linear(all_heads.data(), n, lw.attn.o_proj, out.data());
  kernels::AddInPlace(x, out.data(), n * H);
  kernels::RmsNorm(x, n, H, lw.post_attention_norm.data(), c.rms_norm_eps, mlp_in);
}

void AttentionRunner::ComputeLayer(int64_t layer, MicroBatch& mb, model::MlaKvCache* cache) {
  const model::ModelConfig& c = model_.config();
  const int64_t n = mb.batch.size();
  if (n == 0) return;
  AttentionLayer(layer, mb.batch, *cache, mb.x.data(), mb.mlp_in.data());
  if (!c.IsMoeLayer(layer)) {
    model_.DenseMlp(layer, mb.mlp_in.data(), n, mb.mlp_out.data());
    kernels::AddInPlace(mb.x.data(), mb.mlp_out.data(), n * c.hidden_size);
  }
}

void AttentionRunner::PostMoeSend(int64_t layer, int stage, MicroBatch& mb) {
  const model::ModelConfig& c = model_.config();
  const int64_t n = mb.batch.size();
  const int l = static_cast<int>(layer);
  connector_.SendToFfn(l, stage, kHiddenChannel, {c.hidden_size, DType::kF32}, mb.mlp_in.data(),
                       n);  // takes part even with zero rows
  if (!world_.config().compute_gate_on_attention) return;
  const int64_t k = c.num_experts_per_tok;
  std::vector<int32_t>& ids = routing_ids_.at(stage);  // [n, k], alive until the group ends
  std::vector<float>& weights = routing_weights_.at(stage);
  ids.assign(n * k, 0);
  weights.assign(n * k, 0.0f);
  if (n > 0) {
    model::RouteTokens(c, model_.weights().layers[layer].moe, mb.mlp_in.data(), n, ids.data(),
                       weights.data());
  }
  connector_.SendToFfn(l, stage, kTopkIdsChannel, {k, DType::kI32}, ids.data(), n);
  connector_.SendToFfn(l, stage, kTopkWeightsChannel, {k, DType::kF32}, weights.data(), n);
}

void AttentionRunner::PostMoeRecv(int64_t layer, int stage, MicroBatch& mb) {
  connector_.RecvFromFfn(static_cast<int>(layer), stage, {model_.config().hidden_size, DType::kF32},
                         mb.mlp_out.data(), mb.batch.size());
}

void AttentionRunner::FinishMoe(MicroBatch& mb) {
  const int64_t n = mb.batch.size();
  if (n > 0) kernels::AddInPlace(mb.x.data(), mb.mlp_out.data(), n * model_.config().hidden_size);
}

void AttentionRunner::RunOneStage(MicroBatch& mb, model::MlaKvCache* cache) {
  const model::ModelConfig& c = model_.config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ComputeLayer(l, mb, cache);
    if (!c.IsMoeLayer(l)) continue;
    PostMoeSend(l, 0, mb);
    PostMoeRecv(l, 0, mb);
    FinishMoe(mb);
  }
}

// A0(l) | S0(l)+R1(l-1) | A1(l) | S1(l)+R0(l) | A0(l+1) | ... -- each exchange in one connector
// group, so a send never waits behind a receive the peer is blocked on. The FFN side serves
// stage 0 then stage 1 of every layer, in this order.
void AttentionRunner::RunTwoStages(MicroBatch& mb0, MicroBatch& mb1, model::MlaKvCache* cache) {
  const model::ModelConfig& c = model_.config();
  int64_t pending1 = -1;  // layer whose micro-batch 1 MoE output is still to be received
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ComputeLayer(l, mb0, cache);
    const bool moe = c.IsMoeLayer(l);
    if (moe || pending1 >= 0) {
      connector_.GroupStart();
      if (moe) PostMoeSend(l, 0, mb0);
      if (pending1 >= 0) PostMoeRecv(pending1, 1, mb1);
      connector_.GroupEnd(static_cast<int>(moe ? l : pending1));
      if (pending1 >= 0) FinishMoe(mb1);
      pending1 = -1;
    }
    ComputeLayer(l, mb1, cache);
    if (!moe) continue;
    connector_.GroupStart();
    PostMoeSend(l, 1, mb1);
    PostMoeRecv(l, 0, mb0);
    connector_.GroupEnd(static_cast<int>(l));
    FinishMoe(mb0);
    pending1 = l;
  }
  if (pending1 >= 0) {
    PostMoeRecv(pending1, 1, mb1);
    FinishMoe(mb1);
  }
}

void AttentionRunner::RunLayers(const model::ForwardBatch& batch, model::MlaKvCache* cache,
                                float* logits, int stages) {
  const model::ModelConfig& c = model_.config();
  const int64_t n = batch.size(), H = c.hidden_size;
  // Micro-batch s holds tokens [SplitOffset(n, stages, s), SplitOffset(n, stages, s + 1)).
  std::vector<MicroBatch> mbs(stages);
  for (int s = 0; s < stages; ++s) {
    MicroBatch& mb = mbs[s];
    for (int64_t i = SplitOffset(n, stages, s); i < SplitOffset(n, stages, s + 1); ++i) {
      mb.batch.token_ids.push_back(batch.token_ids[i]);
      mb.batch.seq_slots.push_back(batch.seq_slots[i]);
      mb.batch.positions.push_back(batch.positions[i]);
    }
    const int64_t m = mb.batch.size();
    mb.x.resize(m * H);  // [m, H] each
    mb.mlp_in.resize(m * H);
    mb.mlp_out.resize(m * H);
    if (m > 0) model_.Embed(mb.batch.token_ids.data(), m, mb.x.data());
  }
  routing_ids_.resize(2);
  routing_weights_.resize(2);
  if (stages == 1) {
    RunOneStage(mbs[0], cache);
  } else {
    RunTwoStages(mbs[0], mbs[1], cache);
  }
  if (n == 0) return;
  std::vector<float> x;  // [n, H], micro-batches back in token order
  x.reserve(n * H);
  for (const MicroBatch& mb : mbs) x.insert(x.end(), mb.x.begin(), mb.x.end());
  model::DeepseekModel::CommitBatch(batch, *cache);
  model_.Logits(x.data(), n, logits);
}

}  // namespace afd::runtime

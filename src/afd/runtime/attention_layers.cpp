#include <chrono>

#include "afd/common/error.h"
#include "afd/runtime/attention_runner.h"

// The layers of one step on the attention rank: the model's own attention layer (with this TP
// rank's heads), dense MLPs, and the MoE exchange with the FFN role in one stage or as two
// pipelined micro-batches (DBO).
namespace afd::runtime {

namespace {

// Connector channels of a MoE layer's rows.
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;

}  // namespace

void AttentionRunner::NoteRoundTrip(const MicroBatch& mb,
                                    std::chrono::steady_clock::time_point sent) {
  if (!record_round_trips_ || mb.share_count == 0) return;
  round_trips_.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
}

void AttentionRunner::ComputeLayer(int64_t layer, MicroBatch& mb, kv::PagedKvCache* cache,
                                   Workspace& ws) {
  if (mb.n() == 0) return;
  // Only this layer's scratch is taken after the mark (routing sent in a pending connector group
  // was taken before it and stays).
  const Workspace::Mark scratch = ws.mark();
  model_.Attention(layer, mb.in, *cache, mb.x, mb.mlp_in, ws, tp_group_.get(),
                   mb.pending ? &mb.mlp_out : nullptr);
  mb.pending = false;
  if (!model_.config().IsMoeLayer(layer)) {
    model_.DenseMlp(layer, mb.mlp_in, mb.mlp_out, ws);
    mb.pending = true;
  }
  ws.Rewind(scratch);
}

void AttentionRunner::PostMoeSend(int64_t layer, int stage, MicroBatch& mb, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  const int l = static_cast<int>(layer);
  const Tensor share = mb.mlp_in.Rows(mb.share_begin, mb.share_count);
  connector_.SendToFfn(l, stage, kHiddenChannel, {c.hidden_size, DType::kF32}, share.data(),
                       mb.share_count);  // takes part even with zero rows
  if (!world_.config().compute_gate_on_attention) return;
  const int64_t k = c.num_experts_per_tok;
  // In the step's workspace: alive until the connector group completes.
  mb.ids = ws.Take(DType::kI32, {mb.share_count, k});
  mb.weights = ws.Take(DType::kF32, {mb.share_count, k});
  if (mb.share_count > 0) model_.Route(layer, share, mb.ids, mb.weights, ws);
  connector_.SendToFfn(l, stage, kTopkIdsChannel, {k, DType::kI32}, mb.ids.data(), mb.share_count);
  connector_.SendToFfn(l, stage, kTopkWeightsChannel, {k, DType::kF32}, mb.weights.data(),
                       mb.share_count);
}

void AttentionRunner::PostMoeRecv(int64_t layer, int stage, MicroBatch& mb) {
  const Tensor share = mb.mlp_out.Rows(mb.share_begin, mb.share_count);
  connector_.RecvFromFfn(static_cast<int>(layer), stage, {model_.config().hidden_size, DType::kF32},
                         share.data(), mb.share_count);
}

void AttentionRunner::FinishMoe(MicroBatch& mb) {
  if (tp_group_ && mb.n() > 0) tp_group_->AllGatherRows(mb.mlp_out);
  mb.pending = mb.n() > 0;  // added to x by the next layer's input norm, or at the step's end
}

void AttentionRunner::RunOneStage(MicroBatch& mb, kv::PagedKvCache* cache, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ComputeLayer(l, mb, cache, ws);
    if (!c.IsMoeLayer(l)) continue;
    const auto sent = std::chrono::steady_clock::now();
    PostMoeSend(l, 0, mb, ws);
    PostMoeRecv(l, 0, mb);
    NoteRoundTrip(mb, sent);
    FinishMoe(mb);
  }
}

// A0(l) | S0(l)+R1(l-1) | A1(l) | S1(l)+R0(l) | A0(l+1) | ... -- each exchange in one connector
// group, so a send never waits behind a receive the peer is blocked on. The FFN side serves
// stage 0 then stage 1 of every layer, in this order.
void AttentionRunner::RunTwoStages(MicroBatch& mb0, MicroBatch& mb1, kv::PagedKvCache* cache,
                                   Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  int64_t pending1 = -1;  // layer whose micro-batch 1 MoE output is still to be received
  // When the pending micro-batch's rows left (round trips: until its output is back).
  auto sent0 = std::chrono::steady_clock::now(), sent1 = sent0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ComputeLayer(l, mb0, cache, ws);
    const bool moe = c.IsMoeLayer(l);
    if (moe || pending1 >= 0) {
      if (moe) sent0 = std::chrono::steady_clock::now();
      connector_.GroupStart();
      if (moe) PostMoeSend(l, 0, mb0, ws);
      if (pending1 >= 0) PostMoeRecv(pending1, 1, mb1);
      connector_.GroupEnd(static_cast<int>(moe ? l : pending1));
      if (pending1 >= 0) {
        NoteRoundTrip(mb1, sent1);
        FinishMoe(mb1);
      }
      pending1 = -1;
    }
    ComputeLayer(l, mb1, cache, ws);
    if (!moe) continue;
    sent1 = std::chrono::steady_clock::now();
    connector_.GroupStart();
    PostMoeSend(l, 1, mb1, ws);
    PostMoeRecv(l, 0, mb0);
    connector_.GroupEnd(static_cast<int>(l));
    NoteRoundTrip(mb0, sent0);
    FinishMoe(mb0);
    pending1 = l;
  }
  if (pending1 >= 0) {
    PostMoeRecv(pending1, 1, mb1);
    NoteRoundTrip(mb1, sent1);
    FinishMoe(mb1);
  }
}

Tensor AttentionRunner::RunLayers(const model::ForwardBatch& batch, kv::PagedKvCache* cache,
                                  int stages, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  const int64_t n = batch.size(), H = c.hidden_size;
  const model::StepInputs in = n > 0 ? model_.Upload(batch, ws) : model::StepInputs{};
  const Tensor x = ws.Take(DType::kF32, {n, H});
  const Tensor mlp_in = ws.Take(DType::kF32, {n, H});
  const Tensor mlp_out = ws.Take(DType::kF32, {n, H});
  if (n > 0) model_.Embed(in, x);
  // Micro-batch s holds tokens [SplitOffset(n, stages, s), SplitOffset(n, stages, s + 1)).
  std::vector<MicroBatch> mbs(stages);
  for (int s = 0; s < stages; ++s) {
    MicroBatch& mb = mbs[s];
    const int64_t begin = SplitOffset(n, stages, s), m = SplitSize(n, stages, s);
    mb.in = n > 0 ? in.Slice(begin, m) : model::StepInputs{};
    mb.x = x.Rows(begin, m);
    mb.mlp_in = mlp_in.Rows(begin, m);
    mb.mlp_out = mlp_out.Rows(begin, m);
    mb.share_begin = SplitOffset(m, tp_, tp_rank_);
    mb.share_count = SplitSize(m, tp_, tp_rank_);
  }
  if (stages == 1) {
    RunOneStage(mbs[0], cache, ws);
  } else {
    RunTwoStages(mbs[0], mbs[1], cache, ws);
  }
  for (MicroBatch& mb : mbs) {
    if (mb.pending) model_.backend().Add(mb.x, mb.mlp_out);
  }
  if (n == 0) return Tensor();
  model::DeepseekModel::CommitBatch(batch, *cache);
  return model_.Logits(x, in, ws);
}

}  // namespace afd::runtime

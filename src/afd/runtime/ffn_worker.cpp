#include "afd/runtime/ffn_worker.h"

#include <numeric>

#include "afd/common/error.h"

namespace afd::runtime {

namespace {
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;
// How long one wait for the next step lasts before checking for an abort elsewhere.
constexpr double kIdlePollSeconds = 0.2;
}  // namespace

FfnWorker::FfnWorker(const model::MoeModel& model, comm::AfdWorld& world,
                     connector::P2pConnector& connector)
    : model_(model), world_(world), connector_(connector), ws_(model.backend()) {
  AFD_CHECK(world.self().role == Role::kFfn, "FfnWorker on an attention rank");
  const Topology& t = world.topology();
  std::vector<int> members;
  for (int f = 0; f < t.num_ffn(); ++f) members.push_back(t.WorldRank({Role::kFfn, f}));
  ep_group_ = world.CreateGroup("ffn_ep", members);
  // On a GPU the expert-parallel rows move between device buffers: a group of their own, which
  // the world's communicator factory puts on NCCL ("afd_nccl_*", deploy/device_context.h).
  if (!model.backend().device().is_cpu()) {
    ep_rows_group_ = world.CreateGroup("afd_nccl_ffn_ep", members);
  }
  moe_ = std::make_unique<ExpertParallelMoe>(model, *ep_group_,
                                             ep_rows_group_ ? *ep_rows_group_ : *ep_group_);
}

void FfnWorker::MoeLayer(int64_t layer, int stage, const connector::StepMetadata& meta) {
  const model::ModelConfig& c = model_.config();
  const int64_t H = c.hidden_size, k = c.num_experts_per_tok;
  const std::vector<int64_t> counts = connector_.IncomingRowCounts(meta, stage);
  const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const connector::RowFormat hidden{H, DType::kF32};
  // This layer's scratch is given back when it is done: a step's layers (and stages) then reuse
  // one layer's worth, not the sum of them (a long prefill took every layer's rows at once). On
  // a GPU the next layer's kernels are ordered after this layer's send on the same stream.
  const Workspace::Mark scratch = ws_.mark();
  // [n, H]: all attention peers' rows, in order; ids, weights: [n, k].
  const Tensor rows = ws_.Take(DType::kF32, {n, H}), out = ws_.Take(DType::kF32, {n, H});
  const Tensor ids = ws_.Take(DType::kI32, {n, k}), weights = ws_.Take(DType::kF32, {n, k});
  const int l = static_cast<int>(layer);
  connector_.RecvFromAttention(l, stage, kHiddenChannel, hidden, meta, rows.data());
  if (world_.config().compute_gate_on_attention) {
    connector_.RecvFromAttention(l, stage, kTopkIdsChannel, {k, DType::kI32}, meta, ids.data());
    connector_.RecvFromAttention(l, stage, kTopkWeightsChannel, {k, DType::kF32}, meta,
                                 weights.data());
  } else if (n > 0) {
    model_.Route(layer, rows, ids, weights, ws_);
  }
  moe_->Forward(layer, rows, ids, weights, out, ws_);
  connector_.SendToAttention(l, stage, hidden, meta, out.data());
  rows_served_ += n;
  ws_.Rewind(scratch);
}

int64_t FfnWorker::Run() {
  const model::ModelConfig& c = model_.config();
  int64_t steps = 0;
  while (true) {
    std::optional<connector::StepMetadata> meta = connector_.control_plane().Recv(kIdlePollSeconds);
    if (!meta) {
      world_.CheckAbort();  // idle: nothing to do, unless the deployment is going down
      continue;
    }
    if (meta->has(connector::kShutdown)) return steps;
    ws_.Reset();
    // Stage 0 then stage 1 (and so on) of every MoE layer: the order the attention ranks'
    // micro-batch pipeline posts them in (P2pAttentionMoe, attention_runner.h).
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (!c.IsMoeLayer(l)) continue;
      for (int stage = 0; stage < meta->num_stages; ++stage) MoeLayer(l, stage, *meta);
    }
    ++steps;
  }
}

}  // namespace afd::runtime

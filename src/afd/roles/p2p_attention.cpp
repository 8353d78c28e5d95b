#include "afd/roles/p2p_attention.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::roles {

namespace {

// Connector channels of a MoE layer's rows.
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;

}  // namespace

P2pAttentionMoe::P2pAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                                 connector::P2pConnector& connector, const ReplicaGroup& group)
    : model_(model),
      world_(world),
      connector_(connector),
      tp_(group.tp),
      tp_rank_(group.tp_rank),
      tp_group_(group.tp_group) {}

P2pAttentionMoe::InFlight& P2pAttentionMoe::StageState(int stage) {
  AFD_CHECK(stage >= 0 && stage < connector::kMaxStagesPerLayer,
            "P2P attention MoE: stage {} of at most {}", stage, connector::kMaxStagesPerLayer);
  if (stage >= static_cast<int>(stages_.size())) stages_.resize(stage + 1);
  InFlight& st = stages_[stage];
  if (!st.ws) st.ws = std::make_unique<Workspace>(model_.backend());
  return st;
}

void P2pAttentionMoe::Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
                            Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  InFlight& st = StageState(stage);
  AFD_CHECK(st.layer < 0, "P2P attention MoE: stage {} started layer {} before finishing {}", stage,
            layer, st.layer);
  const int64_t m = hidden.dim(0);
  st.layer = layer;
  st.out = out;
  st.share_begin = SplitOffset(m, tp_, tp_rank_);
  st.share_count = SplitSize(m, tp_, tp_rank_);
  if (group_open_) Flush();  // a group holds one Start
  if (mode_ != Mode::kLocal) {
    connector_.GroupStart();
    group_open_ = true;
    group_layer_ = layer;
  }
  st.sent = std::chrono::steady_clock::now();
  const int l = static_cast<int>(layer);
  const Tensor share = hidden.Rows(st.share_begin, st.share_count);
  const bool send = mode_ != Mode::kLocal;
  if (send) {
    connector_.SendToFfn(l, stage, kHiddenChannel, {c.hidden_size, DType::kF32}, share.data(),
                         st.share_count);  // takes part even with zero rows
  }
  if (!world_.config().compute_gate_on_attention) return;
  const int64_t k = c.num_experts_per_tok;
  // Eagerly alive until the connector group completes (the next Start of this stage resets
  // it); a graph's from the step's workspace, which the graph owns (never reset after capture).
  Workspace& routing = mode_ == Mode::kExchange ? *st.ws : ws;
  if (mode_ == Mode::kExchange) st.ws->Reset();
  const Tensor ids = routing.Take(DType::kI32, {st.share_count, k});
  const Tensor weights = routing.Take(DType::kF32, {st.share_count, k});
  if (st.share_count > 0) model_.Route(layer, share, ids, weights, ws);
  if (!send) return;
  connector_.SendToFfn(l, stage, kTopkIdsChannel, {k, DType::kI32}, ids.data(), st.share_count);
  connector_.SendToFfn(l, stage, kTopkWeightsChannel, {k, DType::kF32}, weights.data(),
                       st.share_count);
}

void P2pAttentionMoe::Finish(int stage, Workspace& /*ws*/) {
  InFlight& st = StageState(stage);
  AFD_CHECK(st.layer >= 0, "P2P attention MoE: Finish of stage {} without a Start", stage);
  const Tensor share = st.out.Rows(st.share_begin, st.share_count);
  if (mode_ == Mode::kLocal) {
    if (st.share_count > 0) model_.backend().Fill(share, 0.0f);
  } else {
    connector_.RecvFromFfn(static_cast<int>(st.layer), stage,
                           {model_.config().hidden_size, DType::kF32}, share.data(),
                           st.share_count);
  }
  Flush();  // the group this receive joined (the Start just before), if any
  if (record_round_trips_ && mode_ == Mode::kExchange && st.share_count > 0) {
    round_trips_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - st.sent).count());
  }
  if (tp_group_ && st.out.dim(0) > 0) tp_group_->AllGatherRows(st.out);
  st.layer = -1;
}

void P2pAttentionMoe::Flush() {
  if (!group_open_) return;
  group_open_ = false;
  connector_.GroupEnd(static_cast<int>(group_layer_));
}

std::vector<double> P2pAttentionMoe::TakeRoundTrips() {
  std::vector<double> out;
  out.swap(round_trips_);
  return out;
}

ReplicaStep DecideP2pStep(const std::vector<int64_t>& v, int A, const DboOptions& dbo) {
  AFD_CHECK(static_cast<int>(v.size()) == 4 * A, "P2P step: {} exchanged values for {} ranks",
            v.size(), A);
  ReplicaStep plan;
  bool any = false, all_graph = true, all_dbo = true;
  for (int r = 0; r < A; ++r) {
    if (v[r] == 0) continue;  // ranks without tokens do not object
    any = true;
    all_dbo = all_dbo && v[2 * A + r] != 0;
    all_graph = all_graph && v[3 * A + r] > 0;
    plan.graph_bucket = std::max(plan.graph_bucket, v[3 * A + r]);
  }
  if (!any || !all_graph) plan.graph_bucket = 0;
  if (plan.graph_bucket > 0) {
    plan.stages = dbo.Splits(plan.graph_bucket, /*prefill=*/false) ? 2 : 1;
  } else {
    plan.stages = any && all_dbo ? 2 : 1;
  }
  return plan;
}

P2pStepCoordinator::P2pStepCoordinator(const model::MoeModel& model, comm::AfdWorld& world,
                                       connector::P2pConnector& connector,
                                       const ReplicaGroup& group)
    : world_(world), connector_(connector), tp_(group.tp), moe_(model, world, connector, group) {
  const Topology& t = world.topology();
  std::vector<int> all;
  for (int a = 0; a < t.num_attention(); ++a) all.push_back(t.WorldRank({Role::kAttention, a}));
  attention_world_ = world.CreateGroup("attention_world", all);
}

std::vector<int64_t> P2pStepCoordinator::ExchangeCounts(int64_t n, bool active, bool wants_dbo,
                                                        int64_t graph_bucket) {
  const int A = world_.topology().num_attention(), me = world_.self().rank;
  std::vector<int64_t> v(4 * A, 0);
  v[3 * A + me] = n > 0 ? graph_bucket : 0;
  v[me] = n;
  v[A + me] = active ? 1 : 0;
  v[2 * A + me] = wants_dbo ? 1 : 0;
  attention_world_->AllReduce(v.data(), v.size(), DType::kI64, comm::ReduceOp::kSum);
  return v;
}

void P2pStepCoordinator::SendMetadata(const std::vector<int64_t>& v, const ReplicaStep& plan,
                                      uint32_t flags) {
  const int A = world_.topology().num_attention(), stages = plan.stages;
  connector::StepMetadata meta;
  meta.step = steps_;
  meta.flags = flags | (plan.graph_bucket > 0 ? connector::kGraphReplay : 0u);
  meta.num_stages = stages;
  meta.num_attention_ranks = A;
  // Rows attention rank r sends in stage s: its TP share of micro-batch s of its replica (a
  // graph step: of the graph size, padding rows included).
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < A; ++r) {
      const int64_t n = plan.graph_bucket > 0 && v[r] > 0 ? plan.graph_bucket : v[r];
      meta.token_counts.push_back(SplitSize(SplitSize(n, stages, s), tp_, r % tp_));
    }
  }
  connector_.control_plane().Send(meta);
  if (!(flags & connector::kShutdown)) ++steps_;
}

ReplicaStep P2pStepCoordinator::Plan(const model::ForwardBatch& batch, int64_t bucket,
                                     const DboOptions& dbo) {
  const std::vector<int64_t> v =
      ExchangeCounts(batch.size(), true, dbo.Splits(batch.size(), batch.HasPrefill()), bucket);
  const ReplicaStep plan = DecideP2pStep(v, world_.topology().num_attention(), dbo);
  SendMetadata(v, plan, 0);
  return plan;
}

void P2pStepCoordinator::BeginBody(bool capturing) {
  moe_.SetMode(capturing ? P2pAttentionMoe::Mode::kCapture : P2pAttentionMoe::Mode::kLocal);
}

int P2pStepCoordinator::EndCapture() {
  captures_.push_back(connector_.EndCapture());
  return static_cast<int>(captures_.size()) - 1;
}

StepCoordinator::Idle P2pStepCoordinator::IdleStep(bool active, const DboOptions& dbo) {
  const int A = world_.topology().num_attention();
  const std::vector<int64_t> v = ExchangeCounts(0, active, false, 0);
  const bool any_active =
      std::any_of(v.begin() + A, v.begin() + 2 * A, [](int64_t f) { return f != 0; });
  if (!any_active) {
    SendMetadata(std::vector<int64_t>(4 * A, 0), ReplicaStep{}, connector::kShutdown);
    return {runtime::ReplicaRunner::IdleResult::kShutdown, 1};
  }
  // No replica has tokens: nothing for the FFN role this step.
  if (std::all_of(v.begin(), v.begin() + A, [](int64_t n) { return n == 0; })) {
    return {runtime::ReplicaRunner::IdleResult::kNoneBusy, 1};
  }
  const ReplicaStep plan = DecideP2pStep(v, A, dbo);
  SendMetadata(v, plan, 0);
  return {runtime::ReplicaRunner::IdleResult::kTookPart, plan.stages};
}

std::unique_ptr<AttentionReplica> MakeP2pAttentionReplica(const model::MoeModel& model,
                                                          comm::AfdWorld& world,
                                                          connector::P2pConnector& connector,
                                                          int tp, DboOptions dbo,
                                                          runtime::CudaGraphOptions graphs) {
  // On a GPU the rows stay in device memory (the data plane over NCCL); the TP all-gather runs
  // over the host transport, so TP stays on CPU ranks (the replica checks it).
  return std::make_unique<AttentionReplica>(
      model, world, tp, dbo, graphs, [&](const ReplicaGroup& group) {
        return std::make_unique<P2pStepCoordinator>(model, world, connector, group);
      });
}

}  // namespace afd::roles

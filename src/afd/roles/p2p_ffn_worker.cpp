#include "afd/roles/p2p_ffn_worker.h"

#include <numeric>

#include "afd/common/error.h"

namespace afd::roles {

namespace {
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;
// How long one wait for the next step lasts before checking for an abort elsewhere.
constexpr double kIdlePollSeconds = 0.2;
}  // namespace

P2pFfnWorker::P2pFfnWorker(const model::MoeModel& model, comm::AfdWorld& world,
                           connector::P2pConnector& connector, bool graphs)
    : model_(model), world_(world), connector_(connector), ws_(model.backend()) {
  AFD_CHECK(world.self().role == Role::kFfn, "P2pFfnWorker on an attention rank");
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
  every_expert_ = t.num_ffn() == 1;
  if (graphs && every_expert_ && model.backend().SupportsGraphs()) {
    // Nothing of the steps before is in flight while capturing (their NCCL transfers).
    graphs_ = std::make_unique<Graphs>(model.backend(), connector, /*sync_before_capture=*/true);
  }
}

P2pFfnWorker::~P2pFfnWorker() = default;

ExpertRange P2pFfnWorker::experts() const { return {moe_->expert_begin(), moe_->expert_end()}; }

std::vector<std::pair<std::string, int64_t>> P2pFfnWorker::Counters() const {
  return {
      {"rows", rows_served_}, {"graph_steps", graph_steps_}, {"graph_captures", num_captures()}};
}

void P2pFfnWorker::MoeLayer(int64_t layer, int stage, const connector::StepMetadata& meta,
                            Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  const int64_t H = c.hidden_size, k = c.num_experts_per_tok;
  const std::vector<int64_t> counts = connector_.IncomingRowCounts(meta, stage);
  const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const connector::RowFormat hidden{H, DType::kF32};
  // This layer's scratch is given back when it is done: a step's layers (and stages) then reuse
  // one layer's worth, not the sum of them (a long prefill took every layer's rows at once). On
  // a GPU the next layer's kernels are ordered after this layer's send on the same stream.
  const Workspace::Mark scratch = ws.mark();
  // [n, H]: all attention peers' rows, in order; ids, weights: [n, k].
  const Tensor rows = ws.Take(DType::kF32, {n, H}), out = ws.Take(DType::kF32, {n, H});
  const int l = static_cast<int>(layer);
  connector_.RecvFromAttention(l, stage, kHiddenChannel, hidden, meta, rows.data());
  const bool gate_here = !world_.config().compute_gate_on_attention;
  const Tensor ids = ws.Take(DType::kI32, {n, k}), weights = ws.Take(DType::kF32, {n, k});
  if (!gate_here) {
    connector_.RecvFromAttention(l, stage, kTopkIdsChannel, {k, DType::kI32}, meta, ids.data());
    connector_.RecvFromAttention(l, stage, kTopkWeightsChannel, {k, DType::kF32}, meta,
                                 weights.data());
  }
  if (!every_expert_) {  // expert parallelism over the FFN ranks (collective: zero rows too)
    if (gate_here && n > 0) model_.Route(layer, rows, ids, weights, ws);
    moe_->Forward(layer, rows, ids, weights, out, ws);
  } else if (n > 0) {
    // Every expert here: the model's expert pass -- the router too when the gate runs here, the
    // shared experts beside -- as the monolithic step's MoE layer runs it.
    model::MoeModel::ExpertPassArgs pass;
    pass.rows = rows;
    pass.ids = ids;
    pass.weights = weights;
    pass.route = gate_here;
    pass.shared_rows = model_.has_shared_experts(layer) ? n : 0;
    pass.out = out;
    model_.ExpertPass(layer, pass, ws);
  }
  connector_.SendToAttention(l, stage, hidden, meta, out.data());
  ws.Rewind(scratch);
}

void P2pFfnWorker::Step(const connector::StepMetadata& meta, Workspace& ws) {
  // The order the attention ranks' layer loop posts them in (MoeModel::MoeStartOrder).
  for (const auto& [layer, stage] : model_.MoeStartOrder(meta.num_stages)) {
    MoeLayer(layer, stage, meta, ws);
  }
}

std::optional<FfnGraphKey> FfnGraphKeyOf(const connector::StepMetadata& meta) {
  if (!meta.has(connector::kGraphReplay)) return std::nullopt;
  return FfnGraphKey{meta.num_stages, meta.token_counts};
}

void P2pFfnWorker::StepFromGraph(const connector::StepMetadata& meta, const FfnGraphKey& key,
                                 int64_t rows) {
  if (graphs_->Serve(key, rows, [&](Workspace& ws) { Step(meta, ws); }) ==
      Graphs::Served::kReplayed) {
    ++graph_steps_;
  }
}

int64_t P2pFfnWorker::Run() {
  const model::ModelConfig& c = model_.config();
  const int64_t moe_layers = c.num_moe_layers();
  int64_t steps = 0;
  while (true) {
    std::optional<connector::StepMetadata> meta = connector_.control_plane().Recv(kIdlePollSeconds);
    if (!meta) {
      world_.CheckAbort();  // idle: nothing to do, unless the deployment is going down
      continue;
    }
    if (meta->has(connector::kShutdown)) return steps;
    int64_t rows = 0;
    for (int stage = 0; stage < meta->num_stages; ++stage) {
      const std::vector<int64_t> counts = connector_.IncomingRowCounts(*meta, stage);
      rows = std::accumulate(counts.begin(), counts.end(), rows);
    }
    // The step's rows, as the monolithic layer loop declares them (a GPU backend's launch
    // choices, e.g. programmatic dependent launch for small steps, in graphs and out).
    model_.backend().SetStepRows(rows);
    const std::optional<FfnGraphKey> key = graphs_ ? FfnGraphKeyOf(*meta) : std::nullopt;
    if (key) {
      StepFromGraph(*meta, *key, rows);
    } else {
      ws_.Reset();
      Step(*meta, ws_);
    }
    rows_served_ += rows * moe_layers;
    ++steps;
  }
}

}  // namespace afd::roles

#include "afd/runtime/p2p_ffn_worker.h"

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

struct P2pFfnWorker::Graph {
  std::unique_ptr<kernels::OpGraph> graph;
  connector::P2pConnector::Captured added;  // what one replay adds to the connector's stats
};

struct P2pFfnWorker::GraphMemory {
  explicit GraphMemory(Allocator& allocator) : ws(allocator) {}
  Workspace ws;
  int64_t chunk_allocations = -1;  // when its first graph was captured
  std::vector<Key> graphs;
};

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
  if (t.num_ffn() == 1) local_moe_ = std::make_unique<model::LocalMoeBackend>(model);
  graphs_enabled_ = graphs && local_moe_ && model.backend().SupportsGraphs();
}

P2pFfnWorker::~P2pFfnWorker() = default;

ExpertRange P2pFfnWorker::experts() const { return {moe_->expert_begin(), moe_->expert_end()}; }

std::vector<std::pair<std::string, int64_t>> P2pFfnWorker::Counters() const {
  return {{"rows", rows_served_}, {"graph_steps", graph_steps_}, {"graph_captures", num_captures_}};
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
  if (local_moe_ && gate_here) {
    // The monolithic step's MoE layer: router, routed and shared experts.
    if (n > 0) local_moe_->Start(layer, stage, rows, out, ws);
  } else {
    const Tensor ids = ws.Take(DType::kI32, {n, k}), weights = ws.Take(DType::kF32, {n, k});
    if (!gate_here) {
      connector_.RecvFromAttention(l, stage, kTopkIdsChannel, {k, DType::kI32}, meta, ids.data());
      connector_.RecvFromAttention(l, stage, kTopkWeightsChannel, {k, DType::kF32}, meta,
                                   weights.data());
    } else if (n > 0) {
      model_.Route(layer, rows, ids, weights, ws);
    }
    if (!local_moe_) {
      moe_->Forward(layer, rows, ids, weights, out, ws);
    } else if (n > 0) {  // every expert here, the routing from the attention ranks
      model_.RoutedExperts(layer, rows, ids, weights, out, ws);
      model_.AddSharedExperts(layer, rows, out, ws);
    }
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

void P2pFfnWorker::StepFromGraph(const connector::StepMetadata& meta, const Key& key,
                                 int64_t rows) {
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    it->second->graph->Replay();
    connector_.Replayed(it->second->added);
    ++graph_steps_;
    return;
  }
  kernels::Backend& backend = model_.backend();
  std::unique_ptr<GraphMemory>& memory = graph_memory_[rows];
  if (!memory) memory = std::make_unique<GraphMemory>(backend);
  Workspace& ws = memory->ws;
  const auto drop_if_grown = [&] {
    if (memory->chunk_allocations < 0 || ws.chunk_allocations() == memory->chunk_allocations) {
      return;
    }
    for (const Key& k : memory->graphs) graphs_.erase(k);  // they point into released memory
    memory->graphs.clear();
    memory->chunk_allocations = -1;
  };
  const auto eagerly = [&] {
    ws.Reset();
    Step(meta, ws);
    ws.Reset();
    drop_if_grown();
  };
  if (warmed_.insert(key).second) {  // the key's first step: eagerly, in the graphs' memory
    eagerly();
    return;
  }
  ws.Reset();
  drop_if_grown();
  backend.Synchronize();  // nothing of the previous steps is in flight while capturing
  const int64_t chunks = ws.chunk_allocations();
  connector_.BeginCapture();
  backend.BeginCapture();
  std::unique_ptr<kernels::OpGraph> graph;
  try {
    Step(meta, ws);
  } catch (...) {
    backend.EndCapture();
    connector_.EndCapture();
    throw;
  }
  graph = backend.EndCapture();
  connector::P2pConnector::Captured added = connector_.EndCapture();
  ++num_captures_;
  if (ws.chunk_allocations() != chunks) {
    // It outgrew the memory while capturing (nothing ran): this step eagerly; the next one
    // captures into the merged memory.
    eagerly();
    return;
  }
  if (memory->chunk_allocations < 0) memory->chunk_allocations = ws.chunk_allocations();
  memory->graphs.push_back(key);
  auto g = std::make_unique<Graph>();
  g->graph = std::move(graph);
  g->added = std::move(added);
  g->graph->Replay();
  connector_.Replayed(g->added);
  graphs_[key] = std::move(g);
  ++graph_steps_;
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
    const std::optional<FfnGraphKey> key = graphs_enabled_ ? FfnGraphKeyOf(*meta) : std::nullopt;
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

}  // namespace afd::runtime

#include "afd/runtime/p2p_attention_runner.h"

#include <algorithm>
#include <optional>

#include "afd/common/error.h"

namespace afd::runtime {

namespace {

// Connector channels of a MoE layer's rows.
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;

}  // namespace

P2pAttentionMoe::P2pAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                                 connector::P2pConnector& connector, int tp, int tp_rank,
                                 TpGroup* tp_group)
    : model_(model),
      world_(world),
      connector_(connector),
      tp_(tp),
      tp_rank_(tp_rank),
      tp_group_(tp_group) {}

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

P2pStepShape DecideP2pStep(const std::vector<int64_t>& v, int A, const DboOptions& dbo) {
  AFD_CHECK(static_cast<int>(v.size()) == 4 * A, "P2P step: {} exchanged values for {} ranks",
            v.size(), A);
  P2pStepShape shape;
  bool any = false, all_graph = true, all_dbo = true;
  for (int r = 0; r < A; ++r) {
    if (v[r] == 0) continue;  // ranks without tokens do not object
    any = true;
    all_dbo = all_dbo && v[2 * A + r] != 0;
    all_graph = all_graph && v[3 * A + r] > 0;
    shape.graph_bucket = std::max(shape.graph_bucket, v[3 * A + r]);
  }
  if (!any || !all_graph) shape.graph_bucket = 0;
  if (shape.graph_bucket > 0) {
    shape.stages = dbo.Splits(shape.graph_bucket, /*prefill=*/false) ? 2 : 1;
  } else {
    shape.stages = any && all_dbo ? 2 : 1;
  }
  return shape;
}

P2pAttentionRunner::P2pAttentionRunner(const model::MoeModel& model, comm::AfdWorld& world,
                                       connector::P2pConnector& connector, int tp, DboOptions dbo,
                                       CudaGraphOptions graphs)
    : model_(model),
      world_(world),
      connector_(connector),
      tp_(tp),
      dbo_(dbo),
      drain_ws_(model.backend()) {
  const Topology& t = world.topology();
  // On a GPU the rows stay in device memory (the data plane over NCCL); the TP all-gather runs
  // over the host transport, so TP stays on CPU ranks.
  AFD_CHECK(tp == 1 || model.backend().device().is_cpu(),
            "attention tensor parallelism with the P2P connector runs on CPU ranks only, not on "
            "{}",
            model.backend().name());
  const int me = world.self().rank;
  AFD_CHECK(world.self().role == Role::kAttention, "P2pAttentionRunner on an FFN rank");
  AFD_CHECK(tp >= 1 && t.num_attention() % tp == 0,
            "attention tensor-parallel size {} does not divide num_attention_ranks {}", tp,
            t.num_attention());
  const int64_t heads = model.config().num_attention_heads;
  AFD_CHECK(tp <= heads, "attention tensor-parallel size {} exceeds the {} attention heads", tp,
            heads);
  tp_rank_ = me % tp;
  std::vector<int> all, replica;
  for (int a = 0; a < t.num_attention(); ++a) all.push_back(t.WorldRank({Role::kAttention, a}));
  attention_world_ = world.CreateGroup("attention_world", all);
  if (tp > 1) {
    const int dp_rank = me / tp;
    for (int i = 0; i < tp; ++i) {
      replica.push_back(t.WorldRank({Role::kAttention, dp_rank * tp + i}));
    }
    tp_comm_ = world.CreateGroup(fmt::format("attention_tp_{}", dp_rank), replica);
    tp_group_ = std::make_unique<TpGroup>(*tp_comm_, heads, model.config().value_head_dim());
  }
  moe_ = std::make_unique<P2pAttentionMoe>(model, world, connector, tp, tp_rank_, tp_group_.get());
  if (!graphs.enforce_eager && model.backend().SupportsGraphs() && tp == 1) {
    graphs_ = std::make_unique<CudaGraphRunner>(model, static_cast<GraphedStep&>(*this), graphs);
  }
}

P2pAttentionRunner::~P2pAttentionRunner() = default;

std::vector<int64_t> P2pAttentionRunner::ExchangeCounts(const model::ForwardBatch& batch,
                                                        bool active, int64_t graph_bucket) {
  const int A = world_.topology().num_attention(), me = world_.self().rank;
  const int64_t n = batch.size();
  std::vector<int64_t> v(4 * A, 0);
  v[3 * A + me] = n > 0 ? graph_bucket : 0;
  v[me] = n;
  v[A + me] = active ? 1 : 0;
  v[2 * A + me] = dbo_.Splits(n, batch.HasPrefill()) ? 1 : 0;
  attention_world_->AllReduce(v.data(), v.size(), DType::kI64, comm::ReduceOp::kSum);
  return v;
}

void P2pAttentionRunner::SendMetadata(const std::vector<int64_t>& v, const P2pStepShape& shape,
                                      uint32_t flags) {
  const int A = world_.topology().num_attention(), stages = shape.stages;
  connector::StepMetadata meta;
  meta.step = static_cast<uint64_t>(steps_);
  meta.flags = flags | (shape.graph_bucket > 0 ? connector::kGraphReplay : 0u);
  meta.num_stages = stages;
  meta.num_attention_ranks = A;
  // Rows attention rank r sends in stage s: its TP share of micro-batch s of its replica (a
  // graph step: of the graph size, padding rows included).
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < A; ++r) {
      const int64_t n = shape.graph_bucket > 0 && v[r] > 0 ? shape.graph_bucket : v[r];
      meta.token_counts.push_back(SplitSize(SplitSize(n, stages, s), tp_, r % tp_));
    }
  }
  connector_.control_plane().Send(meta);
}

int64_t P2pAttentionRunner::Plan(const model::ForwardBatch& batch, int64_t bucket) {
  AFD_CHECK(!planned_, "P2P attention: a step planned twice");
  const std::vector<int64_t> v = ExchangeCounts(batch, true, bucket);
  const P2pStepShape shape = DecideP2pStep(v, world_.topology().num_attention(), dbo_);
  SendMetadata(v, shape, 0);
  planned_ = shape;
  return shape.graph_bucket;
}

Tensor P2pAttentionRunner::Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                                   Workspace& ws) {
  struct Clear {  // a step that fails leaves no plan behind
    std::optional<P2pStepShape>& planned;
    ~Clear() { planned.reset(); }
  } clear{planned_};
  model_.CheckBatch(batch, cache);  // before the exchange: a bad batch fails here, named
  Tensor logits;
  if (graphs_) {
    logits = graphs_->Forward(batch, cache, ws);  // Plan, then Eager or a graph
  } else {
    Plan(batch, 0);
    logits = Eager(batch, cache, ws);
  }
  ++steps_;
  dbo_steps_ += planned_->stages > 1;
  return logits;
}

Tensor P2pAttentionRunner::Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                                 Workspace& ws) {
  AFD_CHECK(planned_ && planned_->graph_bucket == 0, "P2P attention: an eager step not planned");
  const model::StepInputs in = batch.size() > 0 ? model_.Upload(batch, ws) : model::StepInputs{};
  Tensor logits = RunLayers(in, &cache, planned_->stages, ws);
  model::MoeModel::CommitBatch(batch, cache);
  return logits;
}

// A graph's body: a decode bucket of the planned size; its warm-up run (not capturing) keeps the
// MoE here, so that only the replay exchanges with the FFN role.
Tensor P2pAttentionRunner::Body(const model::StepInputs& in, kv::PagedKvCache& cache,
                                Workspace& ws) {
  AFD_CHECK(planned_ && planned_->graph_bucket == in.n,
            "P2P attention: a graph body of {} rows, the step planned {}", in.n,
            planned_ ? planned_->graph_bucket : 0);
  moe_->SetMode(capturing_ ? P2pAttentionMoe::Mode::kCapture : P2pAttentionMoe::Mode::kLocal);
  struct Restore {
    P2pAttentionMoe& moe;
    ~Restore() { moe.SetMode(P2pAttentionMoe::Mode::kExchange); }
  } restore{*moe_};
  return RunLayers(in, &cache, planned_->stages, ws);
}

void P2pAttentionRunner::BeginCapture() {
  capturing_ = true;
  connector_.BeginCapture();
}

int P2pAttentionRunner::EndCapture() {
  capturing_ = false;
  captures_.push_back(connector_.EndCapture());
  return static_cast<int>(captures_.size()) - 1;
}

void P2pAttentionRunner::Replayed(int token) { connector_.Replayed(captures_.at(token)); }

void P2pAttentionRunner::Drain() {
  while (Idle(false) != IdleResult::kShutdown) {
  }
}

P2pAttentionRunner::IdleResult P2pAttentionRunner::Idle(bool active) {
  const int A = world_.topology().num_attention();
  const model::ForwardBatch empty;
  const std::vector<int64_t> v = ExchangeCounts(empty, active, 0);
  const bool any_active =
      std::any_of(v.begin() + A, v.begin() + 2 * A, [](int64_t f) { return f != 0; });
  if (!any_active) {
    SendMetadata(std::vector<int64_t>(4 * A, 0), P2pStepShape{}, connector::kShutdown);
    return IdleResult::kShutdown;
  }
  // No replica has tokens: nothing for the FFN role this step.
  if (std::all_of(v.begin(), v.begin() + A, [](int64_t n) { return n == 0; })) {
    return IdleResult::kNoneBusy;
  }
  // The other ranks' step (perhaps a graph replay): this rank's zero rows, eagerly.
  const P2pStepShape shape = DecideP2pStep(v, A, dbo_);
  SendMetadata(v, shape, 0);
  drain_ws_.Reset();
  RunLayers(model::StepInputs{}, nullptr, shape.stages, drain_ws_);
  ++steps_;
  dbo_steps_ += shape.stages > 1;
  return IdleResult::kTookPart;
}

Tensor P2pAttentionRunner::RunLayers(const model::StepInputs& in, kv::PagedKvCache* cache,
                                     int stages, Workspace& ws) {
  model::LayerLoop loop;
  for (int s = 0; s <= stages; ++s) loop.splits.push_back(SplitOffset(in.n, stages, s));
  loop.tp = tp_group_.get();
  return model_.RunLayers(in, cache, *moe_, ws, loop);
}

}  // namespace afd::runtime

#include "afd/roles/attention_replica.h"

#include <utility>

#include "afd/common/error.h"
#include "afd/topology/topology.h"

namespace afd::roles {

namespace {

// [0, ..., n] cut into `stages` even micro-batches (empty ones too: a lockstep step without
// tokens still runs every stage).
std::vector<int64_t> EvenSplits(int64_t n, int stages) {
  std::vector<int64_t> splits;
  for (int s = 0; s <= stages; ++s) splits.push_back(SplitOffset(n, stages, s));
  return splits;
}

}  // namespace

std::vector<int64_t> StepCoordinator::SplitPoints(const model::ForwardBatch& batch,
                                                  int stages) const {
  return EvenSplits(batch.size(), stages);
}

AttentionReplica::AttentionReplica(const model::MoeModel& model, comm::AfdWorld& world, int tp,
                                   DboOptions dbo, runtime::CudaGraphOptions graphs,
                                   const MakeCoordinator& make_coordinator)
    : model_(model), world_(world), dbo_(dbo), idle_ws_(model.backend()) {
  const Topology& t = world.topology();
  const std::string me = world.Describe(world.world_rank());
  AFD_CHECK(world.self().role == Role::kAttention, "{}: an attention replica on an FFN rank", me);
  const int64_t heads = model.config().num_attention_heads;
  AFD_CHECK(tp >= 1 && t.num_attention() % tp == 0 && tp <= heads,
            "attention tensor-parallel size {}: must divide num_attention_ranks ({}) and not "
            "exceed the model's {} attention heads",
            tp, t.num_attention(), heads);
  // The TP all-gathers run over the host transport: on a GPU the rows would leave the device
  // twice per layer.
  AFD_CHECK(tp == 1 || model.backend().device().is_cpu(),
            "{}: attention tensor parallelism (tp {}) runs on CPU ranks; on {} run one attention "
            "rank per data-parallel replica",
            world.config().connector, tp, model.backend().name());
  ReplicaGroup group;
  group.tp = tp;
  group.tp_rank = world.self().rank % tp;
  if (tp > 1) {
    const int dp_rank = world.self().rank / tp;
    std::vector<int> replica;
    for (int i = 0; i < tp; ++i) {
      replica.push_back(t.WorldRank({Role::kAttention, dp_rank * tp + i}));
    }
    tp_comm_ = world.CreateGroup(fmt::format("attention_tp_{}", dp_rank), replica);
    tp_group_ = std::make_unique<TpGroup>(*tp_comm_, heads, model.config().value_head_dim());
    group.tp_group = tp_group_.get();
  }
  coordinator_ = make_coordinator(group);
  AFD_CHECK(coordinator_ != nullptr, "{}: the attention replica got no step coordinator", me);
  if (!graphs.enforce_eager && model.backend().SupportsGraphs() && tp == 1 &&
      coordinator_->AllowsGraphs()) {
    graphs_ = std::make_unique<runtime::CudaGraphRunner>(
        model, static_cast<runtime::GraphedStep&>(*this), graphs);
  }
}

AttentionReplica::~AttentionReplica() = default;

Tensor AttentionReplica::Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                                 Workspace& ws) {
  struct Clear {  // a step that fails leaves no plan behind
    std::optional<ReplicaStep>& planned;
    ~Clear() { planned.reset(); }
  } clear{planned_};
  coordinator_->BeginStep();
  AFD_CHECK(batch.size() >= 1 || coordinator_->RunsEmptySteps(), "{}: an empty step ({} runs none)",
            world_.Describe(world_.world_rank()), world_.config().connector);
  model_.CheckBatch(batch, cache);  // before any exchange: a bad batch fails here, named
  Tensor logits;
  if (graphs_) {
    logits = graphs_->Forward(batch, cache, ws);  // Plan, then Eager or a graph
  } else {
    Plan(batch, 0);
    logits = Eager(batch, cache, ws);
  }
  ++steps_;
  dbo_steps_ += last_stages_ > 1;
  return logits;
}

int64_t AttentionReplica::Plan(const model::ForwardBatch& batch, int64_t bucket) {
  AFD_CHECK(!planned_, "attention replica: a step planned twice");
  planned_ = coordinator_->Plan(batch, bucket, dbo_);
  return planned_->graph_bucket;
}

Tensor AttentionReplica::Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                               Workspace& ws) {
  AFD_CHECK(planned_ && planned_->graph_bucket == 0,
            "attention replica: an eager step not planned");
  const model::StepInputs in = batch.size() > 0 ? model_.Upload(batch, ws) : model::StepInputs{};
  Tensor logits = RunLayers(in, &cache, coordinator_->SplitPoints(batch, planned_->stages), ws);
  model::MoeModel::CommitBatch(batch, cache);
  coordinator_->EndLayers();
  return logits;
}

// A graph's body: a decode bucket of the planned size (one token per sequence: an even split).
Tensor AttentionReplica::Body(const model::StepInputs& in, kv::PagedKvCache& cache, Workspace& ws) {
  AFD_CHECK(planned_ && planned_->graph_bucket == in.n,
            "attention replica: a graph body of {} rows, the step planned {}", in.n,
            planned_ ? planned_->graph_bucket : 0);
  coordinator_->BeginBody(capturing_);
  struct End {
    StepCoordinator& c;
    ~End() { c.EndBody(); }
  } end{*coordinator_};
  Tensor logits = RunLayers(in, &cache, EvenSplits(in.n, planned_->stages), ws);
  coordinator_->EndLayers();
  return logits;
}

void AttentionReplica::BeginCapture() {
  capturing_ = true;
  coordinator_->BeginCapture();
}

int AttentionReplica::EndCapture() {
  capturing_ = false;
  return coordinator_->EndCapture();
}

void AttentionReplica::Replayed(int token) {
  coordinator_->Replayed(token);
  last_stages_ = planned_ ? planned_->stages : 1;
}

runtime::ReplicaRunner::IdleResult AttentionReplica::Idle(bool active) {
  const StepCoordinator::Idle idle = coordinator_->IdleStep(active, dbo_);
  if (idle.result != IdleResult::kTookPart) return idle.result;
  // The other replicas' step (perhaps a graph replay there): this rank's zero rows, eagerly.
  idle_ws_.Reset();
  RunLayers(model::StepInputs{}, nullptr, EvenSplits(0, idle.stages), idle_ws_);
  ++steps_;
  dbo_steps_ += idle.stages > 1;
  return IdleResult::kTookPart;
}

void AttentionReplica::Drain() {
  while (Idle(false) != IdleResult::kShutdown) {
  }
}

Tensor AttentionReplica::RunLayers(const model::StepInputs& in, kv::PagedKvCache* cache,
                                   std::vector<int64_t> splits, Workspace& ws) {
  model::LayerLoop loop;
  loop.splits = std::move(splits);
  loop.tp = tp_group_.get();
  last_stages_ = static_cast<int>(loop.splits.size()) - 1;
  return model_.RunLayers(in, cache, coordinator_->moe(), ws, loop);
}

}  // namespace afd::roles

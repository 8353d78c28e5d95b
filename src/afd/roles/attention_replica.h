// One AFD attention replica: the attention role's forward step, whichever connector carries the
// MoE layers. Embedding, attention (heads split over the tensor-parallel ranks of the replica),
// dense MLP layers and lm_head run here through the model's one layer loop
// (MoeModel::RunLayers); every MoE layer goes to the FFN role through the coordinator's
// MoeBackend and comes back.
//
// The replica owns what every connector shares:
// - tensor parallelism (CPU ranks): the ranks of one replica hold the same tokens and the full
//   cache; each attends its heads (SplitSizes(num_heads, tp)), the head outputs are
//   all-gathered (roles/tp_group.h), and each rank sends its share of a MoE layer's rows, the
//   outputs all-gathered after: results are exactly those of the monolithic model;
// - dual-batch overlap (DboOptions::Stages): a step that reaches the threshold runs as
//   micro-batches pipelined through the layer loop, so that one attends while another's MoE is
//   away (results do not change: tokens are computed alone);
// - CUDA graphs of decode steps (a GPU backend with graphs, one rank per replica, not
//   enforce_eager, a coordinator that allows them): the whole step -- attention, the connector's
//   device work, the logits -- replayed per batch bucket (runtime/cuda_graph_runner.h);
// - the counters (steps, micro-batched steps, graph steps and captures) and round-trip stats.
//
// What differs between connectors is the StepCoordinator below: what the ranks must agree on
// before a step (P2P: an all-reduce over the attention ranks and the step's metadata to the FFN
// role; async: nothing), what a replica without tokens does (P2P: lockstep empty steps; async:
// nothing until it announces its shutdown), how micro-batches are cut, and the MoeBackend.
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/model/model.h"
#include "afd/roles/dbo_options.h"
#include "afd/roles/tp_group.h"
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/runtime/step_runner.h"

namespace afd::roles {

// This rank's place in its replica: the tensor-parallel size and rank, and the group over which
// the TP shares are gathered (null when tp == 1).
struct ReplicaGroup {
  int tp = 1;
  int tp_rank = 0;
  TpGroup* tp_group = nullptr;
};

// What the ranks decided for one step: its micro-batches and the graph size it replays (0: the
// step runs eagerly).
struct ReplicaStep {
  int stages = 1;
  int64_t graph_bucket = 0;
};

// The connector's part of an attention replica's step. Calls come from the replica, in this
// order per step with tokens: BeginStep, Plan, then either the eager layers (SplitPoints, the
// layer loop over moe(), EndLayers) or a graph (a warm-up body and a captured body the first
// time -- BeginBody/EndBody around each, BeginCapture/EndCapture around the capture -- then
// Replayed after each replay).
class StepCoordinator {
 public:
  virtual ~StepCoordinator() = default;

  // The MoE layers' backend in the model's layer loop.
  virtual model::MoeBackend& moe() = 0;
  // Whether steps may replay CUDA graphs (the replica checks the backend, the options and tp).
  virtual bool AllowsGraphs() const = 0;
  // Whether a step without tokens is valid (P2P: lockstep steps of every rank).
  virtual bool RunsEmptySteps() const = 0;

  // Before anything of a step runs (its batch checked).
  virtual void BeginStep() {}
  // The step's plan: `bucket` is the graph size the batch fits (0: eagerly); the stages follow
  // `dbo` (for a graph: of the graph size), agreed with the other ranks where they must agree.
  virtual ReplicaStep Plan(const model::ForwardBatch& batch, int64_t bucket,
                           const DboOptions& dbo) = 0;
  // Token offsets of an eager step's micro-batches: [0, ..., n], at most `stages` + 1 entries.
  // The default: SplitOffset(n, stages, s).
  virtual std::vector<int64_t> SplitPoints(const model::ForwardBatch& batch, int stages) const;
  // After the layer loop of a step (eager, or a graph's body).
  virtual void EndLayers() {}
  // Around each run of a graph's body (its warm-up: capturing false; its capture: true).
  virtual void BeginBody(bool /*capturing*/) {}
  virtual void EndBody() {}
  // Around a graph's capture; the token EndCapture returns is passed to Replayed after every
  // replay of that graph.
  virtual void BeginCapture() = 0;
  virtual int EndCapture() = 0;
  virtual void Replayed(int token) = 0;

  // A step of a replica without tokens (runtime::ReplicaRunner::Idle). kTookPart: the replica runs
  // an empty step of `stages` micro-batches (every layer, zero rows) with the other replicas.
  struct Idle {
    runtime::ReplicaRunner::IdleResult result = runtime::ReplicaRunner::IdleResult::kNoneBusy;
    int stages = 1;
  };
  virtual Idle IdleStep(bool active, const DboOptions& dbo) = 0;

  virtual void RecordRoundTrips() = 0;
  virtual std::vector<double> TakeRoundTrips() = 0;
};

class AttentionReplica : public runtime::ReplicaRunner, private runtime::GraphedStep {
 public:
  using MakeCoordinator = std::function<std::unique_ptr<StepCoordinator>(const ReplicaGroup&)>;
  // Collective over the replica's ranks: forms its TP group (tp ranks per replica, CPU ranks
  // when tp > 1), then the coordinator. `model` and `world` must outlive the replica.
  AttentionReplica(const model::MoeModel& model, comm::AfdWorld& world, int tp, DboOptions dbo,
                   runtime::CudaGraphOptions graphs, const MakeCoordinator& make_coordinator);
  ~AttentionReplica() override;

  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  bool TakesDeviceIds() const override { return true; }  // Upload and the graphs take them
  IdleResult Idle(bool active) override;
  // Idle(false) until the replica is shut down.
  void Drain() override;
  void RecordRoundTrips() override { coordinator_->RecordRoundTrips(); }
  std::vector<double> TakeRoundTrips() override { return coordinator_->TakeRoundTrips(); }

  int64_t steps() const override { return steps_; }
  int64_t dbo_steps() const override { return dbo_steps_; }
  int64_t graph_steps() const override { return graphs_ ? graphs_->graph_steps() : 0; }
  int64_t num_captures() const override { return graphs_ ? graphs_->num_captures() : 0; }

 private:
  // runtime::GraphedStep: the plan of every step with tokens, the eager step, and a graph's body.
  int64_t Plan(const model::ForwardBatch& batch, int64_t bucket) override;
  Tensor Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  Tensor Body(const model::StepInputs& in, kv::PagedKvCache& cache, Workspace& ws) override;
  void BeginCapture() override;
  int EndCapture() override;
  void Replayed(int token) override;
  // The model's layer loop on `in` (possibly empty: a lockstep step) cut at `splits`.
  Tensor RunLayers(const model::StepInputs& in, kv::PagedKvCache* cache,
                   std::vector<int64_t> splits, Workspace& ws);

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  DboOptions dbo_;
  std::unique_ptr<comm::Communicator> tp_comm_;  // null when tp == 1
  std::unique_ptr<TpGroup> tp_group_;            // null when tp == 1
  std::unique_ptr<StepCoordinator> coordinator_;
  std::unique_ptr<runtime::CudaGraphRunner> graphs_;  // null: every step eager
  std::optional<ReplicaStep> planned_;                // this step's, from Plan until it ends
  bool capturing_ = false;                            // between BeginCapture and EndCapture
  int last_stages_ = 1;                               // micro-batches of the last step
  Workspace idle_ws_;                                 // scratch of the empty steps
  int64_t steps_ = 0;
  int64_t dbo_steps_ = 0;
};

}  // namespace afd::roles

// Data-parallel attention with expert-parallel MoE, every rank a whole model but for its share
// of the routed experts (vLLM's `--data-parallel-size N --enable-expert-parallel`): the
// monolithic deployment an AFD deployment is compared with on the same GPUs.
//
// Each rank runs attention for its own sequences and holds the routers, the shared experts and
// routed experts ExpertRangeOf(E, N, r) (topology/expert_range.h); every MoE layer goes through
// ExpertParallelMoe over the N ranks (dispatch all-to-all, grouped experts, combine), which is
// the arithmetic of the in-process MoE, so every rank's tokens come out exactly as in one
// process holding every expert.
//
// Lockstep: the MoE layers are collective, so every rank takes part in every step. Each step
// starts with an all-reduce of (has tokens, active) over the ranks: a rank with tokens runs its
// step; one without takes part in an empty step (every MoE layer with zero rows) while another
// has tokens, else returns (kNoneBusy: serving waits for requests); when no rank is active any
// more, every rank learns it in the same all-reduce (kShutdown). Generation ends with Drain().
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "afd/comm/communicator.h"
#include "afd/model/model.h"
#include "afd/model/moe_backend.h"
#include "afd/roles/expert_parallel.h"
#include "afd/runtime/step_runner.h"

namespace afd::roles {

// The MoE of one rank of a DP+EP deployment: the router here, then ExpertParallelMoe.
class ExpertParallelMoeBackend : public model::MoeBackend {
 public:
  ExpertParallelMoeBackend(const model::MoeModel& model, ExpertParallelMoe& ep)
      : model_(model), ep_(ep) {}
  void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
             Workspace& ws) override;
  // The MoE layers are collective: a rank without tokens takes part with zero rows.
  bool RunsEmptySteps() const override { return true; }

 private:
  const model::MoeModel& model_;
  ExpertParallelMoe& ep_;
};

class DataParallelExpertParallelRunner : public runtime::ReplicaRunner {
 public:
  // Collective over `group` (all ranks): `rows` carries the MoE rows (the same group on the CPU,
  // a device communicator on a GPU; ExpertParallelMoe). All must outlive the runner.
  DataParallelExpertParallelRunner(const model::MoeModel& model, comm::Communicator& group,
                                   comm::Communicator& rows);

  // One step of this rank's sequences, in lockstep with the other ranks' steps.
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  IdleResult Idle(bool active) override;
  // Idle steps (this rank inactive) until every rank is done.
  void Drain() override;
  // The MoE has no round trip of its own here (no connector): nothing to record.
  void RecordRoundTrips() override {}
  std::vector<double> TakeRoundTrips() override { return {}; }

  int64_t steps() const override { return steps_ + empty_steps_; }
  int64_t dbo_steps() const override { return 0; }
  int64_t own_steps() const { return steps_; }          // steps of this rank's own sequences
  int64_t empty_steps() const { return empty_steps_; }  // steps taken part in without tokens
  const ExpertParallelMoe& moe() const { return ep_; }

 private:
  // All-reduces (has tokens, active) with every rank: how many ranks have tokens, are active.
  std::pair<int64_t, int64_t> Exchange(bool has_tokens, bool active);
  void EmptyStep();

  const model::MoeModel& model_;
  comm::Communicator& group_;
  ExpertParallelMoe ep_;
  ExpertParallelMoeBackend moe_;
  Workspace empty_ws_;  // scratch of the empty steps
  int64_t steps_ = 0, empty_steps_ = 0;
};

}  // namespace afd::roles

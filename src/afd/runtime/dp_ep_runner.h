// Data-parallel attention with expert-parallel MoE, every rank a whole model but for its share
// of the routed experts (vLLM's `--data-parallel-size N --enable-expert-parallel`): the
// monolithic deployment an AFD deployment is compared with on the same GPUs.
//
// Each rank runs attention for its own sequences and holds the routers, the shared experts and
// routed experts [SplitOffset(E, N, r), SplitOffset(E, N, r + 1)); every MoE layer goes through
// ExpertParallelMoe over the N ranks (dispatch all-to-all, grouped experts, combine), which is
// the arithmetic of the in-process MoE, so every rank's tokens come out exactly as in one
// process holding every expert.
//
// Lockstep: the MoE layers are collective, so every rank takes part in every step. Each step
// starts with an all-reduce of "running" flags; a rank whose own sequences are done keeps
// running empty steps (every MoE layer with zero rows) in Drain() until no rank runs.
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <memory>

#include "afd/comm/communicator.h"
#include "afd/model/model.h"
#include "afd/model/moe_backend.h"
#include "afd/runtime/expert_parallel.h"
#include "afd/runtime/step_runner.h"

namespace afd::runtime {

// The MoE of one rank of a DP+EP deployment: the router here, then ExpertParallelMoe.
class ExpertParallelMoeBackend : public model::MoeBackend {
 public:
  ExpertParallelMoeBackend(const model::DeepseekModel& model, ExpertParallelMoe& ep)
      : model_(model), ep_(ep) {}
  void Forward(int64_t layer, const Tensor& hidden, const Tensor& out, Workspace& ws) override;

 private:
  const model::DeepseekModel& model_;
  ExpertParallelMoe& ep_;
};

class DataParallelExpertParallelRunner : public StepRunner {
 public:
  // Collective over `group` (all ranks): `rows` carries the MoE rows (the same group on the CPU,
  // a device communicator on a GPU; ExpertParallelMoe). All must outlive the runner.
  DataParallelExpertParallelRunner(const model::DeepseekModel& model, comm::Communicator& group,
                                   comm::Communicator& rows);

  // One step of this rank's sequences, in lockstep with the other ranks' steps.
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  // Empty steps until no rank has a step to run (every rank calls it once it is done).
  void Drain();

  int64_t steps() const { return steps_; }              // steps of this rank's own sequences
  int64_t empty_steps() const { return empty_steps_; }  // steps taken part in without tokens
  const ExpertParallelMoe& moe() const { return ep_; }

 private:
  // All-reduces this rank's running flag; returns how many ranks run a step now.
  int64_t RunningRanks(bool running);

  const model::DeepseekModel& model_;
  comm::Communicator& group_;
  ExpertParallelMoe ep_;
  ExpertParallelMoeBackend moe_;
  Workspace empty_ws_;  // scratch of the empty steps
  int64_t steps_ = 0, empty_steps_ = 0;
};

}  // namespace afd::runtime

// One forward step of the model: logits [m, vocab] (in ws) for the batch's logits rows,
// appending its tokens to the cache. In process (LocalStepRunner) or as the AFD attention role
// with the MoE layers elsewhere (roles/p2p_attention.h).
#pragma once

#include <vector>

#include "afd/model/model.h"

namespace afd::runtime {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                         Workspace& ws) = 0;
  // Whether Forward honours batch.id_source (ids from the device): the engine schedules a step
  // before the previous one's ids reach the host only through such a runner.
  virtual bool TakesDeviceIds() const { return false; }
  // Called by the engine once the step's last device work after Forward (sampling, the copy of
  // its results to the host) is enqueued.
  virtual void StepEnqueued() {}
};

// The step runner of one AFD attention replica in a serving loop (deploy/replica_serve.h): the
// P2P runner (DP lockstep: Idle takes part in the other replicas' steps) or the asynchronous one
// (independent replicas: Idle only announces the shutdown once the replica is done).
class ReplicaRunner : public StepRunner {
 public:
  enum class IdleResult { kNoneBusy, kTookPart, kShutdown };
  // One step of a replica without tokens. `active`: this replica will still take requests.
  // kNoneBusy: nothing ran (wait for requests); kTookPart: an empty step ran with the other
  // replicas; kShutdown: this replica is done and has said so (no more calls).
  virtual IdleResult Idle(bool active) = 0;
  // The MoE round trips (attention -> FFN -> attention, seconds, one per layer and micro-batch
  // with rows) measured since the last call; recorded only after RecordRoundTrips().
  virtual void RecordRoundTrips() = 0;
  virtual std::vector<double> TakeRoundTrips() = 0;
  // Generation (no serving loop): this replica has no more work; returns when the deployment
  // may shut down (P2P: after empty lockstep steps until every replica is done).
  virtual void Drain() = 0;
  // Steps run (P2P: including empty lockstep steps), and those run as micro-batches.
  virtual int64_t steps() const = 0;
  virtual int64_t dbo_steps() const = 0;
  // Steps replayed from CUDA graphs, and graphs captured (0 where the runner has none).
  virtual int64_t graph_steps() const { return 0; }
  virtual int64_t num_captures() const { return 0; }
};

class LocalStepRunner : public StepRunner {
 public:
  // `model` must outlive the runner; it must hold every expert.
  explicit LocalStepRunner(const model::MoeModel& model) : model_(model), moe_(model) {}
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                 Workspace& ws) override {
    return model_.Forward(batch, cache, moe_, ws);
  }
  bool TakesDeviceIds() const override { return true; }  // MoeModel::Upload takes them

 private:
  const model::MoeModel& model_;
  model::LocalMoeBackend moe_;
};

}  // namespace afd::runtime

// The AFD attention role's forward step over the asynchronous window connector (seed 003).
//
// Each data-parallel replica runs on its own: no all-reduce, no step metadata, no empty steps.
// A replica without work sends nothing; a replica that is done announces its shutdown to every
// FFN rank (Drain, or Idle(false) when serving).
//
// Per MoE layer and micro-batch: route here (DeepseekModel::Route), one stable sort of the
// (token, expert) pairs by (FFN rank, local expert) (connector/dispatch_plan.h), write to each
// FFN rank only the rows it needs -- a token's row once per (token, expert) pair it owns, plus
// its round-robin share of shared-expert tokens -- and wait only for the FFN ranks that got
// rows (a micro-batch whose rows for some FFN rank exceed the slot's routed capacity goes in
// consecutive token chunks that fit). The top-k weights never leave this rank: the FFN returns
// unweighted expert outputs and the combine here is the backend's own MoeCombine over all of a
// token's slots in ascending order from zero, then the shared-expert term added -- the monolithic
// model's arithmetic, so the CPU results are bit-identical to it.
//
// Micro-batches (dual-batch overlap): with connector_extra_config.async_moe_ubatching (or
// --enable-dbo once a step reaches the thresholds, ring_depth >= 2) a step runs as S stages,
// pipelined so that the FFN serves one micro-batch's layer while this rank attends the next:
//   A0(l) S0(l) | A1(l) S1(l) | R0(l) A0(l+1) S0(l+1) | R1(l) A1(l+1) S1(l+1) | ...
// (A: attention, S: dispatch, R: wait for the replies and combine). Each stage has one ring
// slot, so at most one request per (FFN rank, stage) is in flight.
//
// Attention tensor parallelism (CPU ranks; connector_extra_config.attn_ranks_per_dp = the TP
// size): the TP ranks of a replica run the same steps, each with its share of the heads; for
// the MoE each dispatches its share of the micro-batch's tokens (SplitOffset over TP ranks) as
// an independent sender, and after the combine the shares are all-gathered over the TP group.
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/async_connector.h"
#include "afd/connector/dispatch_plan.h"
#include "afd/model/model.h"
#include "afd/runtime/attention_runner.h"
#include "afd/runtime/step_runner.h"
#include "afd/runtime/tp_group.h"

namespace afd::runtime {

// The MoE layers of the asynchronous attention role (a MoeBackend in the model's layer loop):
// Start routes and dispatches this TP rank's share of the micro-batch, Finish waits for the
// replies, combines them and all-gathers the shares over the TP group.
class AsyncAttentionMoe : public model::MoeBackend {
 public:
  // All must outlive this; tp_group: null without tensor parallelism.
  AsyncAttentionMoe(const model::DeepseekModel& model, comm::AfdWorld& world,
                    connector::AsyncConnector& connector, int tp, int tp_rank, TpGroup* tp_group);

  void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
             Workspace& ws) override;
  void Finish(int stage, Workspace& ws) override;
  // After the layer loop, before any later host wait on the stream (the logits, the sampled
  // ids): receives and checks the replies the device consumed.
  void EndStep();

  void RecordRoundTrips() { record_round_trips_ = true; }
  std::vector<double> TakeRoundTrips();
  int64_t split_exchanges() const { return split_exchanges_; }

 private:
  // One micro-batch's MoE rows: hidden and out [m, H], this TP rank's share of them.
  struct MicroBatch {
    Tensor hidden, out;
    int64_t share_begin = 0, share_count = 0;
  };
  // A dispatched MoE layer of one micro-batch whose replies are outstanding.
  struct Pending {
    int64_t layer = -1;
    MicroBatch mb;
    connector::DispatchPlan plan;
    Tensor weights;              // [n, k] top-k weights, kept here
    std::vector<uint64_t> seqs;  // [F] seq of the dispatch to each FFN rank (0: none)
    std::chrono::steady_clock::time_point sent;
    // Device flags: the layer whose replies the stream waited for and combined but the host has
    // not checked yet (CheckReplies), else -1.
    int64_t unchecked_layer = -1;
    // The layer was exchanged in token chunks at dispatch (its rows did not fit one slot): the
    // outputs are in place, Finish only finishes.
    bool combined = false;
    std::unique_ptr<Workspace> ws;  // the routing kept until the combine (reset by Start)
  };
  Pending& StageState(int stage);
  // allow_split: when some FFN rank's routed rows would exceed its slot (skewed routing), the
  // micro-batch is exchanged at once in consecutive token chunks that fit (ExchangeInChunks).
  void Dispatch(int64_t layer, int stage, const MicroBatch& mb, Pending& p, Workspace& ws,
                bool allow_split = true);
  // Token boundaries [0, c1, ..., n) of chunks whose routed rows fit every FFN rank's slot;
  // empty when the whole share fits.
  std::vector<int64_t> FitChunks(const std::vector<int32_t>& ids, int64_t n) const;
  void ExchangeInChunks(int64_t layer, int stage, const MicroBatch& mb, Pending& p, Workspace& ws,
                        const std::vector<int64_t>& cuts);
  // The replies of p into this TP rank's rows of mb.out.
  void CombineRows(int stage, const MicroBatch& mb, Pending& p, Workspace& ws);
  // Receives (host) and checks the replies that the device consumed; before the host blocks on
  // the stream again and before `p` is reused.
  void CheckReplies(int stage, Pending& p);
  void CheckReply(int f, int stage, const Pending& p, int64_t layer,
                  const connector::ReceivedSlot& r) const;

  const model::DeepseekModel& model_;
  comm::AfdWorld& world_;
  connector::AsyncConnector& connector_;
  int tp_, tp_rank_;
  TpGroup* tp_group_;
  std::vector<Pending> stages_;
  int64_t split_exchanges_ = 0;  // MoE exchanges sent in token chunks (skewed routing)
  bool record_round_trips_ = false;
  std::vector<double> round_trips_;
};

class AsyncAttentionRunner : public ReplicaRunner {
 public:
  // `model`, `world` and `connector` must outlive the runner. tp: the attention ranks of one
  // replica (tensor parallelism; > 1 on CPU ranks only).
  AsyncAttentionRunner(const model::DeepseekModel& model, comm::AfdWorld& world,
                       connector::AsyncConnector& connector, int tp, DboOptions dbo = {});

  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  // kNoneBusy while `active` (nothing to do: wait for requests); otherwise announces the
  // shutdown (once) and returns kShutdown.
  IdleResult Idle(bool active) override;
  // Announces this replica's shutdown to every FFN rank (once).
  void Drain() override;
  void RecordRoundTrips() override { moe_->RecordRoundTrips(); }
  std::vector<double> TakeRoundTrips() override { return moe_->TakeRoundTrips(); }

  int64_t steps() const override { return steps_; }
  int64_t dbo_steps() const override { return dbo_steps_; }
  int64_t split_exchanges() const override { return moe_->split_exchanges(); }

 private:
  int ChooseStages(const model::ForwardBatch& batch) const;
  std::vector<int64_t> SplitPoints(const model::ForwardBatch& batch, int stages) const;

  const model::DeepseekModel& model_;
  comm::AfdWorld& world_;
  connector::AsyncConnector& connector_;
  int tp_ = 1, tp_rank_ = 0;
  std::unique_ptr<comm::Communicator> tp_comm_;  // null when tp == 1
  std::unique_ptr<TpGroup> tp_group_;            // null when tp == 1
  std::unique_ptr<AsyncAttentionMoe> moe_;
  DboOptions dbo_;
  int64_t steps_ = 0;
  int64_t dbo_steps_ = 0;
  bool shut_down_ = false;
};

}  // namespace afd::runtime

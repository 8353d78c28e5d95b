// The AFD attention role over the asynchronous window connector: its MoE layers
// (AsyncAttentionMoe) and its step coordinator (AsyncStepCoordinator) in the attention replica
// (roles/attention_replica.h).
//
// Each data-parallel replica runs on its own: no all-reduce, no step metadata, no empty steps.
// A replica without work sends nothing; a replica that is done announces its shutdown to every
// FFN rank (Drain, or Idle(false) when serving).
//
// Per MoE layer and micro-batch (AsyncAttentionMoe below): route here, dispatch on the device
// -- each token once per FFN rank that needs it (its experts there, or its shared experts: token
// t's run on FFN rank t % F), in the model's activation dtype on the wire for bf16 models on a
// GPU -- and every FFN rank gets a slot (zero rows at most), so each step sends the same
// messages whatever the routing. The FFN groups its rows by expert itself (MoePermute) and
// returns partial sums or per-pair outputs; the CPU results are bit-identical to the
// monolithic model's (docs/wire_formats.md, "Async window connector").
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
#include "afd/model/model.h"
#include "afd/roles/attention_replica.h"
#include "afd/roles/dbo_options.h"
#include "afd/roles/tp_group.h"

namespace afd::roles {

// The MoE layers of the asynchronous attention role (a MoeBackend in the model's layer loop).
// Start routes this TP rank's share of the micro-batch and dispatches it on the device
// (Backend::AfdDispatch): each token's row once per FFN rank that needs it, with its expert ids
// and weights, written straight into that rank's slot -- no host copy of the routing, no plan
// on the host -- then the slot's header and flag. Finish waits for every FFN rank's reply and
// combines: per-rank partial sums added (AfdSumPartials; one FFN rank, or bf16 on a GPU), or,
// where results must be those of the monolithic model (the CPU, fp32 models) with several FFN
// ranks, per-(token, expert) outputs combined by the model's own MoeCombine over a token's
// slots ascending, the shared experts added (AfdPairIndex). Then the TP shares are all-gathered.
class AsyncAttentionMoe : public model::MoeBackend {
 public:
  // All must outlive this; group: this rank's place in its replica (TP shares).
  AsyncAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                    connector::AsyncConnector& connector, const ReplicaGroup& group);

  void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
             Workspace& ws) override;
  void Finish(int stage, Workspace& ws) override;
  // After the layer loop, before any later host wait on the stream (the logits, the sampled
  // ids): receives and checks the replies the device consumed.
  void EndStep();

  void RecordRoundTrips() { record_round_trips_ = true; }
  std::vector<double> TakeRoundTrips();
  // Whether replies carry per-pair outputs (kSlotPairs) rather than partial sums.
  bool pairs() const { return pairs_; }

 private:
  // A dispatched MoE layer of one micro-batch whose replies are outstanding.
  struct Pending {
    int64_t layer = -1;
    Tensor out;                                // [m, H] the micro-batch's MoE output
    int64_t share_begin = 0, share_count = 0;  // this TP rank's rows of it
    Tensor ids, weights, send_row;             // [n, k], [n, k], [n, F] views of the buffers
    // The stage's routing buffers at the connector's token capacity, taken once: their
    // addresses never change, so that a CUDA graph may hold them.
    Tensor ids_buf, weights_buf, send_row_buf;
    std::vector<uint64_t> seqs;  // [F] seq of the dispatch to each FFN rank
    std::chrono::steady_clock::time_point sent;
    // Device flags: the layer whose replies the stream waited for and combined but the host has
    // not checked yet (CheckReplies), else -1.
    int64_t unchecked_layer = -1;
    int64_t unchecked_tokens = 0;
    std::unique_ptr<Workspace> ws;  // holds the buffers (never reset)
  };
  Pending& StageState(int stage);
  void Combine(int stage, Pending& p, Workspace& ws);
  // Receives (host) and checks the replies that the device consumed; before the host writes the
  // stage's next header and before `p` is reused.
  void CheckReplies(int stage, Pending& p);
  void CheckReply(int f, int stage, const Pending& p, int64_t layer, int64_t n,
                  const connector::ReceivedSlot& r) const;
  // Rows of FFN rank f's reply: per-pair outputs (pairs) or one partial sum per row.
  int64_t ReplyRows(int f, int64_t n) const;

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::AsyncConnector& connector_;
  int tp_, tp_rank_;
  TpGroup* tp_group_;
  bool pairs_ = false;
  DType wire_ = DType::kF32;  // the dispatched rows' dtype
  std::vector<Pending> stages_;
  bool record_round_trips_ = false;
  std::vector<double> round_trips_;
};

// The async connector's part of an attention replica: nothing to agree before a step; each step
// starts by checking the device waits of the steps before; micro-batches cut at request
// boundaries (connector_extra_config.async_moe_split "request", the default) or evenly
// ("token"); a step's replies checked after its layers. CUDA graphs (a device-sequenced
// connector): decode steps replayed per batch bucket -- attention, routing, the dispatch writes,
// the header and flag kernels, the waits for the replies, the combine and the logits in one
// graph -- whose dispatches carry kSlotGraph, so that the FFN role may replay its own graphs for
// them. A replica without work sends nothing; once done it announces its shutdown to every FFN
// rank (IdleStep(false)).
class AsyncStepCoordinator : public StepCoordinator {
 public:
  // All must outlive this. dbo: the replica's (checked against the ring depth).
  AsyncStepCoordinator(const model::MoeModel& model, comm::AfdWorld& world,
                       connector::AsyncConnector& connector, const ReplicaGroup& group,
                       const DboOptions& dbo);

  model::MoeBackend& moe() override { return moe_; }
  bool AllowsGraphs() const override { return connector_.device_sequenced(); }
  bool RunsEmptySteps() const override { return false; }
  void BeginStep() override;
  ReplicaStep Plan(const model::ForwardBatch& batch, int64_t bucket,
                   const DboOptions& dbo) override;
  std::vector<int64_t> SplitPoints(const model::ForwardBatch& batch, int stages) const override;
  void EndLayers() override { moe_.EndStep(); }
  void BeginCapture() override { connector_.BeginCapture(); }
  int EndCapture() override;
  void Replayed(int token) override { connector_.Replayed(captures_.at(token)); }
  // kNoneBusy while `active` (nothing to do: wait for requests); otherwise announces the
  // shutdown (once) and returns kShutdown.
  Idle IdleStep(bool active, const DboOptions& dbo) override;
  void RecordRoundTrips() override { moe_.RecordRoundTrips(); }
  std::vector<double> TakeRoundTrips() override { return moe_.TakeRoundTrips(); }

 private:
  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::AsyncConnector& connector_;
  AsyncAttentionMoe moe_;
  std::vector<connector::AsyncConnector::Captured> captures_;  // by EndCapture's token
  bool shut_down_ = false;
};

// An attention replica over the asynchronous window connector. `model`, `world` and `connector`
// must outlive it. tp: the attention ranks of one replica (tensor parallelism; > 1 on CPU ranks
// only). With connector_extra_config.async_moe_ubatching every step runs as
// async_moe_num_ubatches micro-batches.
std::unique_ptr<AttentionReplica> MakeAsyncAttentionReplica(const model::MoeModel& model,
                                                            comm::AfdWorld& world,
                                                            connector::AsyncConnector& connector,
                                                            int tp, DboOptions dbo = {},
                                                            runtime::CudaGraphOptions graphs = {});

}  // namespace afd::roles

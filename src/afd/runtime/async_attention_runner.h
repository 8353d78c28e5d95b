// The AFD attention role's forward step over the asynchronous window connector.
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
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/runtime/dbo_options.h"
#include "afd/runtime/step_runner.h"
#include "afd/runtime/tp_group.h"

namespace afd::runtime {

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
  // All must outlive this; tp_group: null without tensor parallelism.
  AsyncAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                    connector::AsyncConnector& connector, int tp, int tp_rank, TpGroup* tp_group);

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

// CUDA graphs (a GPU backend with graphs, a device-sequenced connector, one rank per replica,
// not `graphs.enforce_eager`): decode steps are replayed per batch bucket like the monolithic
// CudaGraphRunner -- attention, routing, the dispatch writes, the header and flag kernels, the
// waits for the replies, the combine and the logits in one graph. Its dispatches carry
// kSlotGraph, so that the FFN role may replay its own graphs for them; everything else (a
// prefill, a batch above the largest size) runs eagerly.
class AsyncAttentionRunner : public ReplicaRunner, private GraphedStep {
 public:
  // `model`, `world` and `connector` must outlive the runner. tp: the attention ranks of one
  // replica (tensor parallelism; > 1 on CPU ranks only).
  AsyncAttentionRunner(const model::MoeModel& model, comm::AfdWorld& world,
                       connector::AsyncConnector& connector, int tp, DboOptions dbo = {},
                       CudaGraphOptions graphs = {});
  ~AsyncAttentionRunner() override;

  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  bool TakesDeviceIds() const override { return true; }  // Upload and the graphs take them
  // Steps replayed from graphs, and graphs captured (0 without graphs).
  int64_t graph_steps() const override;
  int64_t num_captures() const override;
  // kNoneBusy while `active` (nothing to do: wait for requests); otherwise announces the
  // shutdown (once) and returns kShutdown.
  IdleResult Idle(bool active) override;
  // Announces this replica's shutdown to every FFN rank (once).
  void Drain() override;
  void RecordRoundTrips() override { moe_->RecordRoundTrips(); }
  std::vector<double> TakeRoundTrips() override { return moe_->TakeRoundTrips(); }

  int64_t steps() const override { return steps_; }
  int64_t dbo_steps() const override { return dbo_steps_; }

 private:
  int ChooseStages(int64_t n, bool prefill) const;
  std::vector<int64_t> SplitPoints(const model::ForwardBatch& batch, int stages) const;
  // GraphedStep: the eager step, and the body a graph captures.
  Tensor Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  Tensor Body(const model::StepInputs& in, kv::PagedKvCache& cache, Workspace& ws) override;
  void BeginCapture() override;
  int EndCapture() override;
  void Replayed(int token) override;

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::AsyncConnector& connector_;
  int tp_rank_ = 0;
  std::unique_ptr<comm::Communicator> tp_comm_;  // null when tp == 1
  std::unique_ptr<TpGroup> tp_group_;            // null when tp == 1
  std::unique_ptr<AsyncAttentionMoe> moe_;
  DboOptions dbo_;
  std::unique_ptr<CudaGraphRunner> graphs_;  // null: every step eager
  struct Capture {
    connector::AsyncConnector::Captured seqs;
    bool dbo = false;
  };
  std::vector<Capture> captures_;  // by EndCapture's token
  bool last_dbo_ = false;          // whether the last step ran as micro-batches
  int64_t steps_ = 0;
  int64_t dbo_steps_ = 0;
  bool shut_down_ = false;
};

}  // namespace afd::runtime

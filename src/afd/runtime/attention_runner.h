// The AFD attention role's forward step (seed 000): embedding, attention (heads split over the
// tensor-parallel ranks of this data-parallel replica), dense MLP layers, lm_head -- and for every
// MoE layer, the normalized hidden states go to the FFN role through the P2P connector and the
// MoE output comes back.
//
// Data parallelism: every attention rank takes part in every step, in lockstep. Each step starts
// with an all-reduce over all attention ranks of (token count, still-active flag) per rank; that
// vector is the step's DP metadata, sent on the control plane. A replica that has finished its
// own requests keeps running empty (zero-row) steps via Drain() until every replica is done;
// then the control-plane senders send the shutdown step.
//
// Tensor parallelism: the ranks of one replica hold the same tokens and the full MLA cache; each
// attends its heads (SplitSizes(num_heads, tp)) through the model's own attention layer with a
// head range (runtime/tp_group.h), the head outputs are all-gathered, and every rank applies the
// full o_proj (and projects q for all heads), so results are exactly those of the monolithic
// model. For each MoE layer, TP rank r sends only its share of the rows (SplitSizes(n, tp)) to
// the FFN role and the MoE outputs are all-gathered in the replica: the FFN does the work once.
//
// Dual-batch overlap (DBO, the seeds' --enable-dbo): when every rank with tokens has at least
// the threshold (decode or prefill), the step runs as two micro-batches -- each rank's tokens
// split by SplitSizes(n, 2), the control plane carrying two stages -- pipelined so that this
// rank computes one micro-batch's attention while the FFN role works on the other's MoE:
//   A0(l) | S0(l)+R1(l-1) | A1(l) | S1(l)+R0(l) | A0(l+1) | ...   (A: attention, S/R: to/from FFN)
// Tokens are computed alone, so results do not change.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "afd/comm/afd_world.h"
#include "afd/connector/p2p_connector.h"
#include "afd/model/model.h"
#include "afd/runtime/generator.h"
#include "afd/runtime/tp_group.h"

namespace afd::runtime {

// vLLM's DBO settings: micro-batching is used when a step's tokens reach the threshold.
struct DboOptions {
  bool enabled = false;
  int64_t decode_token_threshold = 32;    // decode-only steps
  int64_t prefill_token_threshold = 512;  // steps with prefill tokens
};

// The MoE layers of the P2P attention role (a MoeBackend in the model's layer loop): Start sends
// this TP rank's share of the micro-batch's rows (and their routing when the gate runs here),
// Finish receives the FFN output for them and all-gathers the shares over the TP group. A Start
// opens a connector group that the Finish following it at once joins (DBO: S0(l)+R1(l-1) and
// S1(l)+R0(l) in one group each, so a send never waits behind a receive the peer is blocked on);
// Flush, before any compute, ends a group left open. The FFN side serves stage 0 then stage 1 of
// every layer, in this order. Zero-row steps take part (lockstep).
class P2pAttentionMoe : public model::MoeBackend {
 public:
  // All must outlive this; tp_group: null without tensor parallelism.
  P2pAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                  connector::P2pConnector& connector, int tp, int tp_rank, TpGroup* tp_group);

  void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
             Workspace& ws) override;
  void Finish(int stage, Workspace& ws) override;
  void Flush() override;
  bool RunsEmptySteps() const override { return true; }

  void RecordRoundTrips() { record_round_trips_ = true; }
  std::vector<double> TakeRoundTrips();

 private:
  struct InFlight {
    int64_t layer = -1;
    Tensor out;                                // [m, H] the micro-batch's MoE output
    int64_t share_begin = 0, share_count = 0;  // this TP rank's rows of it
    std::chrono::steady_clock::time_point sent;
    std::unique_ptr<Workspace> ws;  // the routing sent (gate on attention), until the group ends
  };
  InFlight& StageState(int stage);

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::P2pConnector& connector_;
  int tp_, tp_rank_;
  TpGroup* tp_group_;
  std::vector<InFlight> stages_;
  bool group_open_ = false;
  int64_t group_layer_ = -1;  // the layer the open group's time is charged to
  bool record_round_trips_ = false;
  std::vector<double> round_trips_;
};

class AttentionRunner : public ReplicaRunner {
 public:
  // Collective: forms the attention-world group (all attention ranks) and this replica's TP
  // group. `model`, `world` and `connector` must outlive the runner. tp: ranks per replica.
  AttentionRunner(const model::MoeModel& model, comm::AfdWorld& world,
                  connector::P2pConnector& connector, int tp, DboOptions dbo = {});

  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;

  // Runs empty steps until every replica is done, then sends the shutdown step.
  void Drain() override;
  // Serving: one step of a replica without tokens. `active`: this replica will still take
  // requests. Takes part in the other replicas' step when one has tokens (an empty step of
  // every layer: kTookPart); returns at once when no replica has tokens (kNoneBusy); sends the
  // shutdown step when no replica is active any more (kShutdown). Pairs with the other ranks'
  // Forward, Idle or Drain calls: every attention rank makes one such call per step.
  IdleResult Idle(bool active) override;
  void RecordRoundTrips() override { moe_->RecordRoundTrips(); }
  std::vector<double> TakeRoundTrips() override { return moe_->TakeRoundTrips(); }

  int64_t steps() const override { return steps_; }
  int64_t dbo_steps() const override { return dbo_steps_; }

 private:
  // All-reduces this rank's (count, active, wants DBO) with every attention rank; returns
  // [A counts..., A active flags..., A DBO wishes...].
  std::vector<int64_t> ExchangeCounts(const model::ForwardBatch& batch, bool active);
  // 1 or 2: the same on every rank, since it depends only on the exchanged vector.
  int ChooseStages(const std::vector<int64_t>& exchanged) const;
  void SendMetadata(const std::vector<int64_t>& counts, int stages, uint32_t flags);
  // The model's layer loop on `in` (possibly empty: a lockstep step without tokens) as `stages`
  // micro-batches of SplitSizes(n, stages).
  Tensor RunLayers(const model::StepInputs& in, kv::PagedKvCache* cache, int stages, Workspace& ws);

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::P2pConnector& connector_;
  int tp_, tp_rank_;
  std::unique_ptr<comm::Communicator> attention_world_;
  std::unique_ptr<comm::Communicator> tp_comm_;  // null when tp == 1
  std::unique_ptr<TpGroup> tp_group_;            // null when tp == 1
  DboOptions dbo_;
  std::unique_ptr<P2pAttentionMoe> moe_;
  Workspace drain_ws_;  // scratch of the empty steps Drain runs
  int64_t steps_ = 0;
  int64_t dbo_steps_ = 0;
};

}  // namespace afd::runtime

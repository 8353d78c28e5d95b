// The AFD attention role over the P2P connector: its MoE layers (P2pAttentionMoe) and its step
// coordinator (P2pStepCoordinator) in the attention replica (roles/attention_replica.h).
//
// Data parallelism: every attention rank takes part in every step, in lockstep. Each step starts
// with an all-reduce over all attention ranks of (token count, still-active flag, DBO wish,
// graph size) per rank; the vector decides the step (DecideP2pStep) and is the step's DP
// metadata, sent on the control plane. A replica that has finished its own requests keeps
// running empty (zero-row) steps (Idle, Drain) until every replica is done; then the
// control-plane senders send the shutdown step.
//
// Tensor parallelism: for each MoE layer, TP rank r sends only its share of the rows
// (SplitSizes(n, tp)) to the FFN role and the MoE outputs are all-gathered in the replica: the
// FFN does the work once.
//
// Dual-batch overlap: when every rank with tokens wants it, the step runs as two micro-batches
// -- each rank's tokens split by SplitSizes(n, 2), the control plane carrying two stages --
// pipelined so that this rank computes one micro-batch's attention while the FFN role works on
// the other's MoE:
//   A0(l) | S0(l)+R1(l-1) | A1(l) | S1(l)+R0(l) | A0(l+1) | ...   (A: attention, S/R: to/from FFN)
//
// CUDA graphs (FULL_DECODE_ONLY, as the P2P connector's guide has them): a step in which every
// rank that has tokens has a decode batch that a capture size holds is replayed from a graph of
// the whole step -- attention, the connector's NCCL sends and receives, the logits -- every such
// rank padded to the largest of their sizes (ranks without tokens take part eagerly with zero
// rows). The step's metadata then carries kGraphReplay and those padded counts: the FFN role may
// replay its own graph for them, and only then (a matching token count alone never replays). A
// graph's warm-up run before its capture runs the MoE layers here without the connector (zeros),
// so that every rank exchanges exactly once per step whichever ranks capture.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/p2p_connector.h"
#include "afd/model/model.h"
#include "afd/roles/attention_replica.h"
#include "afd/roles/dbo_options.h"
#include "afd/roles/tp_group.h"

namespace afd::roles {

// The MoE layers of the P2P attention role (a MoeBackend in the model's layer loop): Start sends
// this TP rank's share of the micro-batch's rows (and their routing when the gate runs here),
// Finish receives the FFN output for them and all-gathers the shares over the TP group. A Start
// opens a connector group that the Finish following it at once joins (DBO: S0(l)+R1(l-1) and
// S1(l)+R0(l) in one group each, so a send never waits behind a receive the peer is blocked on);
// Flush, before any compute, ends a group left open. The FFN side serves stage 0 then stage 1 of
// every layer, in this order. Zero-row steps take part (lockstep).
class P2pAttentionMoe : public model::MoeBackend {
 public:
  // All must outlive this; group: this rank's place in its replica (TP shares).
  P2pAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                  connector::P2pConnector& connector, const ReplicaGroup& group);

  void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
             Workspace& ws) override;
  void Finish(int stage, Workspace& ws) override;
  void Flush() override;
  bool RunsEmptySteps() const override { return true; }

  void RecordRoundTrips() { record_round_trips_ = true; }
  std::vector<double> TakeRoundTrips();

  // kExchange: the rows go to the FFN role and back. kCapture: the same, recorded into a CUDA
  // graph (routing buffers from the step's workspace, which the graph owns). kLocal: a graph's
  // warm-up run -- the routing runs, nothing is sent, the MoE output is zeros.
  enum class Mode { kExchange, kCapture, kLocal };
  void SetMode(Mode mode) { mode_ = mode; }

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
  Mode mode_ = Mode::kExchange;
};

// exchanged: [A token counts, A still-active flags, A DBO wishes, A graph sizes (0: eager)].
// A graph step when every rank with tokens has a graph size (the largest of them); its stages
// then follow from that size alone (DBO at the decode threshold), so that every rank's graph
// and every idle rank agree. Otherwise two micro-batches when every rank with tokens wants them.
ReplicaStep DecideP2pStep(const std::vector<int64_t>& exchanged, int num_attention,
                          const DboOptions& dbo);

// The P2P connector's part of an attention replica: the step's all-reduce over every attention
// rank and the metadata it sends the FFN role, lockstep empty steps, the connector's captured
// sends and receives per graph.
class P2pStepCoordinator : public StepCoordinator {
 public:
  // Collective: forms the attention-world group (all attention ranks). All must outlive this.
  P2pStepCoordinator(const model::MoeModel& model, comm::AfdWorld& world,
                     connector::P2pConnector& connector, const ReplicaGroup& group);

  model::MoeBackend& moe() override { return moe_; }
  bool AllowsGraphs() const override { return true; }
  bool RunsEmptySteps() const override { return true; }
  ReplicaStep Plan(const model::ForwardBatch& batch, int64_t bucket,
                   const DboOptions& dbo) override;
  // A graph's warm-up run keeps the MoE here (zeros), so that only the replay exchanges.
  void BeginBody(bool capturing) override;
  void EndBody() override { moe_.SetMode(P2pAttentionMoe::Mode::kExchange); }
  void BeginCapture() override { connector_.BeginCapture(); }
  int EndCapture() override;
  void Replayed(int token) override { connector_.Replayed(captures_.at(token)); }
  // Takes part in the other replicas' step when one has tokens (kTookPart); kNoneBusy when no
  // replica has tokens; sends the shutdown step when no replica is active any more (kShutdown).
  Idle IdleStep(bool active, const DboOptions& dbo) override;
  void RecordRoundTrips() override { moe_.RecordRoundTrips(); }
  std::vector<double> TakeRoundTrips() override { return moe_.TakeRoundTrips(); }

 private:
  // All-reduces this rank's (count, active, wants DBO, graph size) with every attention rank;
  // returns [A counts..., A active flags..., A DBO wishes..., A graph sizes...].
  std::vector<int64_t> ExchangeCounts(int64_t n, bool active, bool wants_dbo, int64_t graph_bucket);
  // The step's metadata: the exchanged counts (a graph step: each rank with tokens at the
  // graph size, with kGraphReplay).
  void SendMetadata(const std::vector<int64_t>& exchanged, const ReplicaStep& plan, uint32_t flags);

  comm::AfdWorld& world_;
  connector::P2pConnector& connector_;
  int tp_;
  std::unique_ptr<comm::Communicator> attention_world_;
  P2pAttentionMoe moe_;
  std::vector<connector::P2pConnector::Captured> captures_;  // by EndCapture's token
  uint64_t steps_ = 0;  // steps whose metadata was sent (the shutdown step not counted)
};

// An attention replica over the P2P connector (collective over the attention ranks). `model`,
// `world` and `connector` must outlive it. tp: ranks per replica (CPU ranks when > 1).
std::unique_ptr<AttentionReplica> MakeP2pAttentionReplica(const model::MoeModel& model,
                                                          comm::AfdWorld& world,
                                                          connector::P2pConnector& connector,
                                                          int tp, DboOptions dbo = {},
                                                          runtime::CudaGraphOptions graphs = {});

}  // namespace afd::roles

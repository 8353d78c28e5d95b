// The AFD attention role's forward step over the P2P connector: embedding, attention (heads split
// over the tensor-parallel ranks of this data-parallel replica), dense MLP layers, lm_head -- and
// for every MoE layer, the normalized hidden states go to the FFN role through the P2P connector
// and the MoE output comes back.
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
// CUDA graphs (FULL_DECODE_ONLY, as the P2P connector's guide has them; a GPU backend with graphs,
// one rank per replica, not `graphs.enforce_eager`): a step in which every rank that has tokens has
// a decode batch that a capture size holds is replayed from a graph of the whole step -- attention,
// the connector's NCCL sends and receives, the logits -- every such rank padded to the largest of
// their sizes (ranks without tokens take part eagerly with zero rows). The step's metadata then
// carries kGraphReplay and those padded counts: the FFN role may replay its own graph for them, and
// only then (a matching token count alone never replays). A graph's warm-up run before its capture
// runs the MoE layers here without the connector (zeros), so that every rank exchanges exactly
// once per step whichever ranks capture. Everything else runs eagerly.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/p2p_connector.h"
#include "afd/model/model.h"
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/runtime/dbo_options.h"
#include "afd/runtime/generator.h"
#include "afd/runtime/tp_group.h"

namespace afd::runtime {

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

// What the attention ranks decide together for one step, from the exchanged vector: the
// micro-batches, and the graph size every rank with tokens replays (0: the step runs eagerly).
struct P2pStepShape {
  int stages = 1;
  int64_t graph_bucket = 0;
};
// exchanged: [A token counts, A still-active flags, A DBO wishes, A graph sizes (0: eager)].
// A graph step when every rank with tokens has a graph size (the largest of them); its stages
// then follow from that size alone (DBO at the decode threshold), so that every rank's graph
// and every idle rank agree. Otherwise two micro-batches when every rank with tokens wants them.
P2pStepShape DecideP2pStep(const std::vector<int64_t>& exchanged, int num_attention,
                           const DboOptions& dbo);

class P2pAttentionRunner : public ReplicaRunner, private GraphedStep {
 public:
  // Collective: forms the attention-world group (all attention ranks) and this replica's TP
  // group. `model`, `world` and `connector` must outlive the runner. tp: ranks per replica.
  P2pAttentionRunner(const model::MoeModel& model, comm::AfdWorld& world,
                     connector::P2pConnector& connector, int tp, DboOptions dbo = {},
                     CudaGraphOptions graphs = {});
  ~P2pAttentionRunner() override;

  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  bool TakesDeviceIds() const override { return graphs_ != nullptr; }
  // Steps replayed from graphs, and graphs captured (0 without graphs).
  int64_t graph_steps() const override { return graphs_ ? graphs_->graph_steps() : 0; }
  int64_t num_captures() const override { return graphs_ ? graphs_->num_captures() : 0; }

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
  // All-reduces this rank's (count, active, wants DBO, graph size) with every attention rank;
  // returns [A counts..., A active flags..., A DBO wishes..., A graph sizes...].
  std::vector<int64_t> ExchangeCounts(const model::ForwardBatch& batch, bool active,
                                      int64_t graph_bucket);
  // The step's metadata: the exchanged counts (a graph step: each rank with tokens at the
  // graph size, with kGraphReplay).
  void SendMetadata(const std::vector<int64_t>& exchanged, const P2pStepShape& shape,
                    uint32_t flags);
  // GraphedStep: the exchange and metadata of every step with tokens (graph or not), the eager
  // step, and the body a graph captures.
  int64_t Plan(const model::ForwardBatch& batch, int64_t bucket) override;
  Tensor Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  Tensor Body(const model::StepInputs& in, kv::PagedKvCache& cache, Workspace& ws) override;
  void BeginCapture() override;
  int EndCapture() override;
  void Replayed(int token) override;
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
  Workspace drain_ws_;                       // scratch of the empty steps Drain runs
  std::unique_ptr<CudaGraphRunner> graphs_;  // null: every step eager
  std::optional<P2pStepShape> planned_;      // this step's, from Plan until it runs
  bool capturing_ = false;
  std::vector<connector::P2pConnector::Captured> captures_;  // by EndCapture's token
  int64_t steps_ = 0;
  int64_t dbo_steps_ = 0;
};

}  // namespace afd::runtime

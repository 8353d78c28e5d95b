// The FFN role's worker loop over the P2P connector: blocks on the next step's DP metadata, derives
// every MoE layer's row counts from it (per stage: micro-batches are served stage by stage),
// receives the rows of all its attention peers at once, runs the MoE layer (router here unless
// compute_gate_on_attention; experts sharded over the FFN ranks), and returns the results. Ends
// cleanly on the shutdown step; a lost peer or an abort anywhere in the deployment ends it with an
// afd::Error naming it.
//
// One FFN rank (xA1F) holds every expert and runs the model's own MoE code (the monolithic
// step's); several share the experts through ExpertParallelMoe (its routing on the host).
//
// CUDA graphs (FULL_DECODE_ONLY, as the P2P connector's guide has them; one FFN rank, a GPU backend
// with graphs): a step whose metadata carries kGraphReplay -- the attention ranks replay their
// graphs -- is served from a graph of the whole step (every MoE layer's receives, experts and
// sends) keyed by its stages and token counts: the key's first such step runs eagerly in the
// graphs' memory (sizing it), the second captures and replays. A step without the flag never
// replays, whatever its counts (a prefill of as many tokens as a decode bucket runs eagerly).
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/p2p_connector.h"
#include "afd/model/model.h"
#include "afd/roles/expert_parallel.h"
#include "afd/roles/ffn_graph_cache.h"
#include "afd/roles/ffn_role.h"

namespace afd::roles {

// The FFN graph a P2P step may be served from (the P2P connector's rule): only a step that the
// attention ranks flagged as a graph replay, keyed by its stages and every rank's token counts;
// nullopt: the step runs eagerly, whatever its counts (an eager prefill of a decode bucket's size).
using FfnGraphKey = std::pair<int, std::vector<int64_t>>;
std::optional<FfnGraphKey> FfnGraphKeyOf(const connector::StepMetadata& meta);

class P2pFfnWorker : public FfnRole {
 public:
  // Collective over the FFN ranks: forms the expert-parallel group "ffn_ep". graphs: whether
  // kGraphReplay steps may be served from graphs (where the backend and topology allow).
  P2pFfnWorker(const model::MoeModel& model, comm::AfdWorld& world,
               connector::P2pConnector& connector, bool graphs = true);
  ~P2pFfnWorker() override;

  // Serves steps until the shutdown step. Returns the number of steps served.
  int64_t Run() override;
  ExpertRange experts() const override;
  // rows, graph_steps, graph_captures.
  std::vector<std::pair<std::string, int64_t>> Counters() const override;

  int64_t rows_served() const { return rows_served_; }
  int64_t graph_steps() const { return graph_steps_; }  // steps replayed from graphs
  int64_t num_captures() const { return graphs_ ? graphs_->num_captures() : 0; }
  const ExpertParallelMoe& moe() const { return *moe_; }

 private:
  // Every MoE layer and stage of one step, enqueued (scratch from ws, given back per layer).
  void Step(const connector::StepMetadata& meta, Workspace& ws);
  void MoeLayer(int64_t layer, int stage, const connector::StepMetadata& meta, Workspace& ws);
  // A kGraphReplay step: from its key's graph (see above).
  void StepFromGraph(const connector::StepMetadata& meta, const FfnGraphKey& key, int64_t rows);

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::P2pConnector& connector_;
  std::unique_ptr<comm::Communicator> ep_group_;       // counts (host transport)
  std::unique_ptr<comm::Communicator> ep_rows_group_;  // rows on a GPU (NCCL), else null
  std::unique_ptr<ExpertParallelMoe> moe_;
  bool every_expert_ = false;  // one FFN rank: the model's own expert pass, no EP exchange
  Workspace ws_;               // reset every step
  // The step graphs, pooled by the step's rows; null: every step eager.
  using Graphs = FfnGraphCache<connector::P2pConnector, FfnGraphKey>;
  std::unique_ptr<Graphs> graphs_;
  int64_t rows_served_ = 0, graph_steps_ = 0;
};

}  // namespace afd::roles

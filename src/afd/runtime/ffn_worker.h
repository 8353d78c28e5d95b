// The FFN role's worker loop (seed 000): blocks on the next step's DP metadata, derives every
// MoE layer's row counts from it (per stage: micro-batches are served stage by stage), receives the
// rows of all its attention peers at once, runs the MoE layer (router here unless
// compute_gate_on_attention; experts sharded over the FFN ranks), and returns the results. Ends
// cleanly on the shutdown step; a lost peer or an abort anywhere in the deployment ends it with an
// afd::Error naming it.
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <memory>

#include "afd/comm/afd_world.h"
#include "afd/connector/p2p_connector.h"
#include "afd/model/model.h"
#include "afd/runtime/expert_parallel.h"

namespace afd::runtime {

class FfnWorker {
 public:
  // Collective over the FFN ranks: forms the expert-parallel group "ffn_ep".
  FfnWorker(const model::MoeModel& model, comm::AfdWorld& world,
            connector::P2pConnector& connector);

  // Serves steps until the shutdown step. Returns the number of steps served.
  int64_t Run();

  int64_t rows_served() const { return rows_served_; }
  const ExpertParallelMoe& moe() const { return *moe_; }

 private:
  void MoeLayer(int64_t layer, int stage, const connector::StepMetadata& meta);

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::P2pConnector& connector_;
  std::unique_ptr<comm::Communicator> ep_group_;       // counts (host transport)
  std::unique_ptr<comm::Communicator> ep_rows_group_;  // rows on a GPU (NCCL), else null
  std::unique_ptr<ExpertParallelMoe> moe_;
  Workspace ws_;  // reset every step
  int64_t rows_served_ = 0;
};

}  // namespace afd::runtime

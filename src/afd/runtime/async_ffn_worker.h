// The FFN role's loop over the asynchronous window connector (seed 003): no control plane. It
// polls its window and serves work items -- one MoE layer of one micro-batch of one attention
// replica -- in arrival order, whichever replica and layer they belong to. A work item arrives
// already routed and grouped by local expert, so nothing is routed here: the rows run through
// this rank's experts unweighted (GroupedExpertMlp), its round-robin share of tokens through the
// shared experts, and both go back to the sender, which weights and combines them. FFN ranks do
// not talk to each other.
//
// A poll that finds nothing returns after recv_poll_timeout_ms, checking for an abort and for
// exited peers; the loop ends once every attention rank has sent its shutdown slot, and then
// announces its own to every attention rank.
//
// Thread safety: one thread.
#pragma once

#include <cstdint>

#include "afd/comm/afd_world.h"
#include "afd/connector/async_connector.h"
#include "afd/model/model.h"

namespace afd::runtime {

class AsyncFfnWorker {
 public:
  // `model` must hold this rank's routed experts [expert_begin, expert_end) of the connector
  // and the shared experts. All arguments must outlive the worker.
  AsyncFfnWorker(const model::DeepseekModel& model, comm::AfdWorld& world,
                 connector::AsyncConnector& connector);

  // Serves work items until every attention rank has shut down. Returns the number served.
  int64_t Run();

  int64_t rows_served() const { return rows_served_; }
  int64_t expert_begin() const { return begin_; }
  int64_t expert_end() const { return end_; }

 private:
  void Serve(const connector::ReceivedSlot& in);

  const model::DeepseekModel& model_;
  comm::AfdWorld& world_;
  connector::AsyncConnector& connector_;
  int64_t begin_, end_;
  Workspace ws_;  // reset every work item
  int64_t rows_served_ = 0;
};

}  // namespace afd::runtime

// The seam between the attention part of a decoder layer and its MoE part (router, routed
// experts, shared experts). The model's layer loop (MoeModel::RunLayers, the only loop over
// layers) starts every MoE layer of a micro-batch with MoeBackend::Start and completes it with
// Finish before that micro-batch's next attention: the local implementation does everything in
// Start; the AFD attention role plugs in backends that ship the rows to the FFN role in Start
// and combine the replies in Finish, so that the other micro-batches' attention runs between.
#pragma once

#include <cstdint>

#include "afd/tensor/tensor.h"
#include "afd/tensor/workspace.h"

namespace afd::model {

class MoeModel;

class MoeBackend {
 public:
  virtual ~MoeBackend() = default;
  // Starts MoE layer `layer` of micro-batch `stage`: hidden: [n, H], its
  // post_attention_layernorm-ed input; out: [n, H] (overwritten) = routed + shared experts,
  // complete once Finish(stage) returns. Rows are independent. Scratch taken from ws is released
  // when Start returns (what must live until Finish is the backend's own); hidden and out stay
  // valid until Finish.
  virtual void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
                     Workspace& ws) = 0;
  // Completes the last Start of `stage` (default: Start did everything).
  virtual void Finish(int /*stage*/, Workspace& /*ws*/) {}
  // Called before each attention or dense MLP of the loop: transfers Start deferred (to post them
  // together with a Finish that follows at once) must go now.
  virtual void Flush() {}
  // Whether a step without tokens still runs its MoE layers (zero-row Starts and Finishes): the
  // P2P connector's lockstep, where every attention rank takes part in every exchange.
  virtual bool RunsEmptySteps() const { return false; }
};

// Router + routed experts [0, E) + shared experts, in process:
//   out = RoutedExperts(Route(hidden)) + shared(hidden)   (this order, like transformers)
// The model must hold every routed expert. Thread safety: one Forward at a time.
class LocalMoeBackend : public MoeBackend {
 public:
  explicit LocalMoeBackend(const MoeModel& model) : model_(model) {}
  void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
             Workspace& ws) override;

 private:
  const MoeModel& model_;
};

}  // namespace afd::model

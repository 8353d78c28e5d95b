// The seam between the attention part of a decoder layer and its MoE part (router, routed
// experts, shared experts). The model calls MoeBackend::Forward for every MoE layer; the local
// implementation runs everything in this process, and the AFD attention role plugs in a backend
// that ships the rows to the FFN role instead.
#pragma once

#include <cstdint>

#include "afd/tensor/tensor.h"
#include "afd/tensor/workspace.h"

namespace afd::model {

class DeepseekModel;

class MoeBackend {
 public:
  virtual ~MoeBackend() = default;
  // hidden: [n, H], the post_attention_layernorm-ed input of MoE layer `layer`. out: [n, H]
  // (overwritten) = routed + shared experts. Rows are independent. Scratch from ws.
  virtual void Forward(int64_t layer, const Tensor& hidden, const Tensor& out, Workspace& ws) = 0;
};

// Router + routed experts [0, E) + shared experts, in process:
//   out = RoutedExperts(Route(hidden)) + shared(hidden)   (this order, like transformers)
// The model must hold every routed expert. Thread safety: one Forward at a time.
class LocalMoeBackend : public MoeBackend {
 public:
  explicit LocalMoeBackend(const DeepseekModel& model) : model_(model) {}
  void Forward(int64_t layer, const Tensor& hidden, const Tensor& out, Workspace& ws) override;

 private:
  const DeepseekModel& model_;
};

}  // namespace afd::model

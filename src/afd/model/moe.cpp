// The MoE block of MoeModel on this process's experts, and the in-process MoeBackend.
#include "afd/common/error.h"
#include "afd/model/model.h"

namespace afd::model {

void MoeModel::Route(int64_t layer, const Tensor& hidden, const Tensor& ids, const Tensor& weights,
                     Workspace& ws) const {
  const MoeWeights& w = RouterOf(layer);
  const Tensor logits = ws.Take(DType::kF32, {hidden.dim(0), config_.n_routed_experts});
  backend_.RouterGateTopk(hidden, w.gate, w.e_score_correction_bias, router_spec_, logits, ids,
                          weights);
}

const MoeWeights& MoeModel::RouterOf(int64_t layer) const {
  AFD_CHECK(config_.IsMoeLayer(layer), "layer {} is not a MoE layer", layer);
  const MoeWeights& w = weights_.layers[layer].moe;
  AFD_CHECK(!w.gate.empty(), "the router of layer {} is not loaded in this process", layer);
  return w;
}

MoeModel::Grouping MoeModel::TakeGrouping(int64_t layer, int64_t n, Workspace& ws) const {
  const int64_t local = weights_.layers[layer].moe.experts.num_experts();
  const int64_t k = config_.num_experts_per_tok;
  return {ws.Take(DType::kI32, {local + 1}), ws.Take(DType::kI32, {n * k}),
          ws.Take(DType::kI32, {n, k})};
}

void MoeModel::RoutedExperts(int64_t layer, const Tensor& hidden, const Tensor& ids,
                             const Tensor& weights, const Tensor& out, Workspace& ws) const {
  const kernels::ExpertWeights& experts = weights_.layers[layer].moe.experts;
  const Grouping g = TakeGrouping(layer, hidden.dim(0), ws);
  backend_.MoePermute(ids, experts.expert_begin, experts.num_experts(), g.offsets, g.src_row,
                      g.row_of_slot);
  GroupedExperts(layer, hidden, weights, g, nullptr, out, ws);
}

void MoeModel::RouteAndRoutedExperts(int64_t layer, const Tensor& hidden, const Tensor& ids,
                                     const Tensor& weights, const Tensor* shared_out,
                                     const Tensor& out, Workspace& ws) const {
  const MoeWeights& w = RouterOf(layer);
  const Tensor logits = ws.Take(DType::kF32, {hidden.dim(0), config_.n_routed_experts});
  const Grouping g = TakeGrouping(layer, hidden.dim(0), ws);
  backend_.RouteAndPermute(hidden, w.gate, w.e_score_correction_bias, router_spec_, logits, ids,
                           weights, w.experts.expert_begin, w.experts.num_experts(), g.offsets,
                           g.src_row, g.row_of_slot);
  GroupedExperts(layer, hidden, weights, g, shared_out, out, ws);
}

void MoeModel::GroupedExperts(int64_t layer, const Tensor& hidden, const Tensor& weights,
                              const Grouping& g, const Tensor* shared_out, const Tensor& out,
                              Workspace& ws) const {
  const kernels::ExpertWeights& experts = weights_.layers[layer].moe.experts;
  const int64_t n = hidden.dim(0), k = config_.num_experts_per_tok, h = config_.hidden_size;
  // Every slot may land here: size the grouped rows for all of them.
  const Tensor grouped = ws.Take(DType::kF32, {n * k, h});
  const Tensor expert_out = ws.Take(DType::kF32, {n * k, h});
  backend_.GatheredExpertMlp(hidden, g.src_row, grouped, g.offsets, experts, expert_out);
  if (shared_out == nullptr) {
    backend_.MoeCombine(expert_out, g.row_of_slot, weights, /*accumulate=*/false, out);
    return;
  }
  backend_.JoinBeside();  // the shared experts' output is written
  backend_.MoeCombineAdd(expert_out, g.row_of_slot, weights, *shared_out, out);
}

void MoeModel::SharedExperts(int64_t layer, const Tensor& hidden, const Tensor& out,
                             Workspace& ws) const {
  const MlpWeights& shared = weights_.layers[layer].moe.shared;
  AFD_CHECK(!shared.empty(), "layer {} has no shared experts loaded in this process", layer);
  if (hidden.dim(0) == 0) return;
  Mlp(shared, hidden, out, ws);
}

void MoeModel::AddSharedExperts(int64_t layer, const Tensor& hidden, const Tensor& out,
                                Workspace& ws) const {
  const MlpWeights& shared = weights_.layers[layer].moe.shared;
  if (shared.empty() || hidden.dim(0) == 0) return;
  const Tensor y = ws.Take(DType::kF32, {hidden.dim(0), config_.hidden_size});
  Mlp(shared, hidden, y, ws);
  backend_.Add(out, y);
}

void LocalMoeBackend::Start(int64_t layer, int /*stage*/, const Tensor& hidden, const Tensor& out,
                            Workspace& ws) {
  const ModelConfig& c = model_.config();
  const int64_t n = hidden.dim(0), k = c.num_experts_per_tok;
  AFD_CHECK(model_.weights().layers[layer].moe.experts.num_experts() == c.n_routed_experts,
            "in-process MoE needs every routed expert loaded");
  // The shared experts beside the routed ones (both only read `hidden`), added after them by the
  // combine: out = routed + shared, as AddSharedExperts adds them.
  const bool shared = !model_.weights().layers[layer].moe.shared.empty() && n > 0;
  const Tensor shared_out = shared ? ws.Take(DType::kF32, {n, c.hidden_size}) : Tensor();
  if (shared) {
    model_.backend().Beside([&] { model_.SharedExperts(layer, hidden, shared_out, ws); }, n);
  }
  const Tensor ids = ws.Take(DType::kI32, {n, k});
  const Tensor weights = ws.Take(DType::kF32, {n, k});
  model_.RouteAndRoutedExperts(layer, hidden, ids, weights, shared ? &shared_out : nullptr, out,
                               ws);
}

}  // namespace afd::model

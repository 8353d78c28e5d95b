// The MoE block of MoeModel on this process's experts, and the in-process MoeBackend.
#include <algorithm>

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

MoeModel::ExpertPassOutputs MoeModel::ExpertPass(int64_t layer, const ExpertPassArgs& a,
                                                 Workspace& ws) const {
  const kernels::ExpertWeights& experts = weights_.layers[layer].moe.experts;
  const int64_t N = a.rows.dim(0), H = config_.hidden_size, local = experts.num_experts();
  const int64_t k = a.route ? config_.num_experts_per_tok : a.ids.dim(1);
  AFD_CHECK(a.ids.dim(0) == N && a.ids.dim(1) == k && k >= 1 && k <= config_.num_experts_per_tok,
            "layer {}: the expert pass of {} rows got ids [{}, {}] ({} slots a token at most)",
            layer, N, a.ids.dim(0), a.ids.dim(1), config_.num_experts_per_tok);
  AFD_CHECK(a.shared_rows >= 0 && a.shared_rows <= N,
            "layer {}: shared experts for {} of the pass's {} rows", layer, a.shared_rows, N);
  const int64_t m = N * std::min(k, local);  // slots that can be here
  ExpertPassOutputs o;
  o.shared_out = a.shared_out.empty() && a.shared_rows > 0
                     ? ws.Take(DType::kF32, {a.shared_rows, H})
                     : a.shared_out;
  if (a.shared_rows > 0) {
    backend_.Beside([&] { SharedExperts(layer, a.rows.Rows(0, a.shared_rows), o.shared_out, ws); },
                    a.shared_rows);
  }
  o.pair_out = a.pair_out.empty() ? ws.Take(DType::kF32, {m, H}) : a.pair_out;
  o.row_of_slot = a.row_of_slot.empty() ? ws.Take(DType::kI32, {N, k}) : a.row_of_slot;
  if (N > 0) {
    const Tensor offsets = ws.Take(DType::kI32, {local + 1});
    const Tensor src_row = ws.Take(DType::kI32, {N * k});
    if (a.route) {
      const MoeWeights& w = RouterOf(layer);
      const Tensor logits = ws.Take(DType::kF32, {N, config_.n_routed_experts});
      backend_.RouteAndPermute(a.rows, w.gate, w.e_score_correction_bias, router_spec_, logits,
                               a.ids, a.weights, experts.expert_begin, local, offsets, src_row,
                               o.row_of_slot);
    } else {
      backend_.MoePermute(a.ids, experts.expert_begin, local, offsets, src_row, o.row_of_slot);
    }
    const Tensor grouped = ws.Take(DType::kF32, {m, H});
    backend_.GatheredExpertMlp(a.rows, src_row.Rows(0, m), grouped, offsets, experts, o.pair_out);
  }
  if (a.shared_rows > 0) backend_.JoinBeside();  // the shared experts' output is written
  if (a.out.empty() || N == 0) return o;
  const int64_t S = a.shared_rows;
  if (S > 0) {
    backend_.MoeCombineAdd(o.pair_out, o.row_of_slot.Rows(0, S), a.weights.Rows(0, S), o.shared_out,
                           a.out.Rows(0, S));
  }
  if (N > S) {
    backend_.MoeCombine(o.pair_out, o.row_of_slot.Rows(S, N - S), a.weights.Rows(S, N - S),
                        /*accumulate=*/false, a.out.Rows(S, N - S));
  }
  return o;
}

void MoeModel::RoutedExperts(int64_t layer, const Tensor& hidden, const Tensor& ids,
                             const Tensor& weights, const Tensor& out, Workspace& ws) const {
  ExpertPassArgs a;
  a.rows = hidden;
  a.ids = ids;
  a.weights = weights;
  a.out = out;
  ExpertPass(layer, a, ws);
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
  // The shared experts beside the router and the routed ones (all only read `hidden`), added
  // by the combine: out = routed + shared, as AddSharedExperts adds them.
  MoeModel::ExpertPassArgs a;
  a.rows = hidden;
  a.route = true;
  a.shared_rows = model_.has_shared_experts(layer) ? n : 0;
  if (a.shared_rows > 0) a.shared_out = ws.Take(DType::kF32, {n, c.hidden_size});
  a.ids = ws.Take(DType::kI32, {n, k});
  a.weights = ws.Take(DType::kF32, {n, k});
  a.out = out;
  model_.ExpertPass(layer, a, ws);
}

}  // namespace afd::model

#include "afd/roles/dp_ep_runner.h"

#include <vector>

#include "afd/common/error.h"

namespace afd::roles {

void ExpertParallelMoeBackend::Start(int64_t layer, int /*stage*/, const Tensor& hidden,
                                     const Tensor& out, Workspace& ws) {
  const int64_t n = hidden.dim(0), k = model_.config().num_experts_per_tok;
  const Tensor ids = ws.Take(DType::kI32, {n, k});
  const Tensor weights = ws.Take(DType::kF32, {n, k});
  if (n > 0) model_.Route(layer, hidden, ids, weights, ws);
  ep_.Forward(layer, hidden, ids, weights, out, ws);
}

DataParallelExpertParallelRunner::DataParallelExpertParallelRunner(const model::MoeModel& model,
                                                                   comm::Communicator& group,
                                                                   comm::Communicator& rows)
    : model_(model),
      group_(group),
      ep_(model, group, rows),
      moe_(model, ep_),
      empty_ws_(model.backend()) {}

std::pair<int64_t, int64_t> DataParallelExpertParallelRunner::Exchange(bool has_tokens,
                                                                       bool active) {
  int64_t v[2] = {has_tokens ? 1 : 0, active ? 1 : 0};
  group_.AllReduce(v, 2, DType::kI64, comm::ReduceOp::kSum);
  return {v[0], v[1]};
}

Tensor DataParallelExpertParallelRunner::Forward(const model::ForwardBatch& batch,
                                                 kv::PagedKvCache& cache, Workspace& ws) {
  Exchange(/*has_tokens=*/true, /*active=*/true);
  ++steps_;
  return model_.Forward(batch, cache, moe_, ws);
}

runtime::ReplicaRunner::IdleResult DataParallelExpertParallelRunner::Idle(bool active) {
  const auto [with_tokens, still_active] = Exchange(/*has_tokens=*/false, active);
  if (with_tokens > 0) {
    EmptyStep();
    return IdleResult::kTookPart;
  }
  return still_active > 0 ? IdleResult::kNoneBusy : IdleResult::kShutdown;
}

void DataParallelExpertParallelRunner::Drain() {
  while (Idle(/*active=*/false) != IdleResult::kShutdown) {
  }
}

void DataParallelExpertParallelRunner::EmptyStep() {
  // The model's layer loop without tokens: every MoE layer with zero rows (the rows received
  // for this rank's experts take one layer's scratch at a time).
  empty_ws_.Reset();
  model_.RunLayers(model::StepInputs{}, nullptr, moe_, empty_ws_, {});
  ++empty_steps_;
}

}  // namespace afd::roles

#include "afd/runtime/expert_parallel.h"

#include <algorithm>

#include "afd/common/error.h"
#include "afd/kernels/cpu/ops.h"
#include "afd/model/experts.h"
#include "afd/topology/topology.h"

namespace afd::runtime {

ExpertParallelMoe::ExpertParallelMoe(const model::ModelConfig& config,
                                     const model::ModelWeights& weights, comm::Communicator& ep)
    : config_(config), weights_(weights), ep_(ep) {
  const int64_t E = config.n_routed_experts;
  const int F = ep.size();
  owner_.resize(E);
  for (int f = 0; f < F; ++f) {
    for (int64_t e = SplitOffset(E, F, f); e < SplitOffset(E, F, f + 1); ++e) owner_[e] = f;
  }
  begin_ = SplitOffset(E, F, ep.rank());
  end_ = SplitOffset(E, F, ep.rank() + 1);
}

void ExpertParallelMoe::Forward(int64_t layer, const float* rows, int64_t n, const int32_t* ids,
                                const float* weights, float* out) {
  const int64_t H = config_.hidden_size, k = config_.num_experts_per_tok;
  const int F = ep_.size(), me = ep_.rank();
  const model::MoeWeights& w = weights_.layers[layer].moe;

  // 1. Dispatch: entries (token, slot) grouped by owner, in (token, slot) order within a group.
  std::vector<std::vector<int64_t>> by_owner(F);  // entry index t*k + j
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      AFD_CHECK(e >= 0 && e < config_.n_routed_experts,
                "layer {}: token {} is routed to expert {}, outside [0, {})", layer, t, e,
                config_.n_routed_experts);
      by_owner[owner_[e]].push_back(t * k + j);
    }
  }
  std::vector<int64_t> send_n(F), recv_n(F);
  for (int p = 0; p < F; ++p) send_n[p] = static_cast<int64_t>(by_owner[p].size());
  ep_.AllToAllV(send_n.data(), std::vector<size_t>(F, 1), recv_n.data(), std::vector<size_t>(F, 1),
                DType::kI64);
  int64_t total_send = 0, total_recv = 0;
  for (int p = 0; p < F; ++p) {
    total_send += send_n[p];
    total_recv += recv_n[p];
  }
  std::vector<float> send_rows(total_send * H);  // [total_send, H]
  std::vector<int32_t> send_ids(total_send);
  int64_t pos = 0;
  for (int p = 0; p < F; ++p) {
    for (int64_t entry : by_owner[p]) {
      std::copy(rows + (entry / k) * H, rows + (entry / k + 1) * H, send_rows.begin() + pos * H);
      send_ids[pos++] = ids[entry];
    }
  }
  std::vector<size_t> send_rows_n(F), recv_rows_n(F), send_ids_n(F), recv_ids_n(F);
  for (int p = 0; p < F; ++p) {
    send_rows_n[p] = send_n[p] * H;
    recv_rows_n[p] = recv_n[p] * H;
    send_ids_n[p] = send_n[p];
    recv_ids_n[p] = recv_n[p];
  }
  std::vector<float> held_rows(total_recv * H);  // [total_recv, H] rows for my experts
  std::vector<int32_t> held_ids(total_recv);
  ep_.AllToAllV(send_rows.data(), send_rows_n, held_rows.data(), recv_rows_n, DType::kF32);
  ep_.AllToAllV(send_ids.data(), send_ids_n, held_ids.data(), recv_ids_n, DType::kI32);

  // 2. Run each owned expert on all the rows it holds.
  std::vector<float> held_out(total_recv * H);  // [total_recv, H] unweighted expert outputs
  std::vector<std::vector<int64_t>> by_expert(end_ - begin_);
  for (int64_t i = 0; i < total_recv; ++i) {
    AFD_CHECK(held_ids[i] >= begin_ && held_ids[i] < end_,
              "layer {}: received a row for expert {}, which FFN rank {} does not own", layer,
              held_ids[i], me);
    by_expert[held_ids[i] - begin_].push_back(i);
  }
  std::vector<float> x, y;
  for (int64_t e = begin_; e < end_; ++e) {
    const auto& list = by_expert[e - begin_];
    if (list.empty()) continue;
    AFD_CHECK(!w.experts[e].empty(), "routed expert {} is not loaded on FFN rank {}", e, me);
    const int64_t m = static_cast<int64_t>(list.size());
    x.resize(m * H);
    y.resize(m * H);
    for (int64_t r = 0; r < m; ++r) {
      std::copy(held_rows.begin() + list[r] * H, held_rows.begin() + (list[r] + 1) * H,
                x.begin() + r * H);
    }
    model::MlpForward(w.experts[e], x.data(), m, y.data());
    for (int64_t r = 0; r < m; ++r) {
      std::copy(y.begin() + r * H, y.begin() + (r + 1) * H, held_out.begin() + list[r] * H);
    }
  }

  // 3. Combine: outputs go back the way the rows came.
  std::vector<float> back(total_send * H);  // [total_send, H], aligned with send_rows
  ep_.AllToAllV(held_out.data(), recv_rows_n, back.data(), send_rows_n, DType::kF32);
  std::vector<const float*> slot_out(n * k);
  pos = 0;
  for (int p = 0; p < F; ++p) {
    for (int64_t entry : by_owner[p]) slot_out[entry] = back.data() + (pos++) * H;
  }
  // Per token, weight x output in ascending expert order from zero: RoutedExperts' order.
  std::fill(out, out + n * H, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * H;
    for (int64_t j = 0; j < k; ++j) {
      const float* yr = slot_out[t * k + j];
      const float wt = weights[t * k + j];
      for (int64_t i = 0; i < H; ++i) o[i] += yr[i] * wt;
    }
  }
  if (!w.shared.empty() && n > 0) {
    std::vector<float> shared(n * H);  // [n, H]
    model::MlpForward(w.shared, rows, n, shared.data());
    kernels::AddInPlace(out, shared.data(), n * H);
  }
}

}  // namespace afd::runtime

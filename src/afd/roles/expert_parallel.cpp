#include "afd/roles/expert_parallel.h"

#include <algorithm>
#include <cstring>

#include "afd/common/error.h"
#include "afd/topology/expert_range.h"
#include "afd/topology/topology.h"

namespace afd::roles {

ExpertParallelMoe::ExpertParallelMoe(const model::MoeModel& model, comm::Communicator& ep,
                                     comm::Communicator& ep_rows)
    : model_(model), ep_(ep), ep_rows_(ep_rows) {
  AFD_CHECK(ep_rows.size() == ep.size() && ep_rows.rank() == ep.rank(),
            "expert parallelism: the row group {} (rank {} of {}) is not the count group {} (rank "
            "{} of {})",
            ep_rows.name(), ep_rows.rank(), ep_rows.size(), ep.name(), ep.rank(), ep.size());
  const int64_t E = model.config().n_routed_experts;
  const int F = ep.size();
  owner_.resize(E);
  for (int64_t e = 0; e < E; ++e) owner_[e] = ExpertOwner(e, E, F);
  const ExpertRange mine = ExpertRangeOf(E, F, ep.rank());
  begin_ = mine.begin;
  end_ = mine.end;
  // Every rank must split the same experts the same way and hold its share, or a row would
  // reach a rank that does not hold its expert: (E, begin, end, holds them) of every rank,
  // checked once here (collective), not per layer on a host copy of the rows' experts (a wait
  // for the device on a GPU).
  bool holds = true;
  for (int64_t layer = 0; layer < model.config().num_hidden_layers; ++layer) {
    if (!model.config().IsMoeLayer(layer)) continue;
    const kernels::ExpertWeights& w = model.weights().layers[layer].moe.experts;
    holds = holds && w.expert_begin == begin_ && w.num_experts() == end_ - begin_;
  }
  std::vector<int64_t> table(4 * F, 0);
  table[4 * ep.rank()] = E;
  table[4 * ep.rank() + 1] = begin_;
  table[4 * ep.rank() + 2] = end_;
  table[4 * ep.rank() + 3] = holds ? 1 : 0;
  ep.AllReduce(table.data(), table.size(), DType::kI64, comm::ReduceOp::kSum);
  for (int f = 0; f < F; ++f) {
    const ExpertRange want = ExpertRangeOf(E, F, f);
    AFD_CHECK(table[4 * f] == E && table[4 * f + 1] == want.begin && table[4 * f + 2] == want.end,
              "expert parallelism: {} has {} routed experts and owns [{}, {}); {} (rank {} of {}) "
              "expects {} experts, [{}, {}) there",
              ep.DescribeRank(f), table[4 * f], table[4 * f + 1], table[4 * f + 2], ep.name(),
              ep.rank(), F, E, want.begin, want.end);
    AFD_CHECK(table[4 * f + 3] == 1,
              "expert parallelism: {} does not hold the weights of its experts [{}, {}) in every "
              "MoE layer",
              ep.DescribeRank(f), table[4 * f + 1], table[4 * f + 2]);
  }
}

void ExpertParallelMoe::Forward(int64_t layer, const Tensor& rows, const Tensor& ids_t,
                                const Tensor& weights, const Tensor& out, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  const int64_t H = c.hidden_size, k = c.num_experts_per_tok, n = rows.dim(0);
  const int F = ep_.size(), me = ep_.rank();
  // The routing on the host (a copy on a GPU; CopyToHost waits for the router).
  std::vector<int32_t> ids_host(n * k);
  if (n > 0) backend.CopyToHost(ids_host.data(), ids_t);
  const int32_t* ids = ids_host.data();
  const kernels::ExpertWeights& experts = model_.weights().layers[layer].moe.experts;
  AFD_CHECK(experts.expert_begin == begin_ && experts.num_experts() == end_ - begin_,
            "FFN rank {} holds experts [{}, {}), expert parallelism needs [{}, {})", me,
            experts.expert_begin, experts.expert_begin + experts.num_experts(), begin_, end_);

  // 1. Dispatch: entries (token, slot) grouped by owner, in (token, slot) order within a group.
  std::vector<std::vector<int64_t>> by_owner(F);  // entry index t*k + j
  for (int64_t s = 0; s < n * k; ++s) {
    AFD_CHECK(ids[s] >= 0 && ids[s] < c.n_routed_experts,
              "layer {}: token {} is routed to expert {}, outside [0, {})", layer, s / k, ids[s],
              c.n_routed_experts);
    by_owner[owner_[ids[s]]].push_back(s);
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
  const Tensor send_rows = ws.Take(DType::kF32, {total_send, H});
  const Tensor send_ids = ws.Take(DType::kI32, {total_send});
  std::vector<int32_t> src(total_send), send_ids_host(total_send);  // token, expert of each row
  int64_t pos = 0;
  for (int p = 0; p < F; ++p) {
    for (int64_t entry : by_owner[p]) {
      src[pos] = static_cast<int32_t>(entry / k);
      send_ids_host[pos++] = ids[entry];
    }
  }
  const Tensor src_t = ws.Take(DType::kI32, {total_send});
  backend.CopyToDevice(src_t, src.data());
  backend.CopyToDevice(send_ids, send_ids_host.data());
  backend.GatherRows(rows, src_t, send_rows);
  std::vector<size_t> send_rows_n(F), recv_rows_n(F), send_ids_n(F), recv_ids_n(F);
  for (int p = 0; p < F; ++p) {
    send_rows_n[p] = send_n[p] * H;
    recv_rows_n[p] = recv_n[p] * H;
    send_ids_n[p] = send_n[p];
    recv_ids_n[p] = recv_n[p];
  }
  const Tensor held_rows = ws.Take(DType::kF32, {total_recv, H});  // rows for my experts
  const Tensor held_ids = ws.Take(DType::kI32, {total_recv, 1});
  ep_rows_.AllToAllV(send_rows.data(), send_rows_n, held_rows.data(), recv_rows_n, DType::kF32);
  ep_rows_.AllToAllV(send_ids.data(), send_ids_n, held_ids.data(), recv_ids_n, DType::kI32);
  // Every received row is for an expert of this rank: the senders map experts to ranks as this
  // rank does (checked at construction) and checked the ids they sent.

  // 2. The model's expert pass over every row held here (one slot each), unweighted, then back
  // in held order.
  model::MoeModel::ExpertPassArgs pass;
  pass.rows = held_rows;
  pass.ids = held_ids;
  const model::MoeModel::ExpertPassOutputs done = model_.ExpertPass(layer, pass, ws);
  const Tensor held_out = ws.Take(DType::kF32, {total_recv, H});  // unweighted, held order
  if (total_recv > 0) {
    backend.GatherRows(done.pair_out, done.row_of_slot.Reshape({total_recv}), held_out);
  }

  // 3. Combine: outputs go back the way the rows came, then weight x output per token in slot
  // (= ascending expert) order from zero, then the shared experts.
  const Tensor back = ws.Take(DType::kF32, {total_send, H});  // aligned with send_rows
  ep_rows_.AllToAllV(held_out.data(), recv_rows_n, back.data(), send_rows_n, DType::kF32);
  const Tensor row_of_slot = ws.Take(DType::kI32, {n, k});
  std::vector<int32_t> row_of_slot_host(n * k);
  pos = 0;
  for (int p = 0; p < F; ++p) {
    for (int64_t entry : by_owner[p]) row_of_slot_host[entry] = static_cast<int32_t>(pos++);
  }
  backend.CopyToDevice(row_of_slot, row_of_slot_host.data());
  backend.MoeCombine(back, row_of_slot, weights, /*accumulate=*/false, out);
  model_.AddSharedExperts(layer, rows, out, ws);
}

}  // namespace afd::roles

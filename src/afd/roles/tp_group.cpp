#include "afd/roles/tp_group.h"

#include <algorithm>
#include <vector>

#include "afd/common/error.h"
#include "afd/topology/topology.h"

namespace afd::roles {

TpGroup::TpGroup(comm::Communicator& comm, int64_t num_heads, int64_t v_head_dim)
    : comm_(comm), num_heads_(num_heads), dv_(v_head_dim) {
  AFD_CHECK(comm.size() <= num_heads, "attention tensor-parallel size {} exceeds the {} heads",
            comm.size(), num_heads);
}

int64_t TpGroup::head_begin() const { return SplitOffset(num_heads_, size(), rank()); }
int64_t TpGroup::head_end() const { return SplitOffset(num_heads_, size(), rank() + 1); }

void TpGroup::AllGatherHeads(const Tensor& mine, const Tensor& all) {
  const int tp = size();
  const int64_t n = mine.dim(0);
  AFD_CHECK(mine.device().is_cpu() && all.device().is_cpu(),
            "attention TP over the host transport needs host tensors");
  // Every rank sends its block [n, my_heads·dv] to every rank.
  std::vector<float> send(tp * mine.numel());
  for (int p = 0; p < tp; ++p) {
    std::copy(mine.data_as<const float>(), mine.data_as<const float>() + mine.numel(),
              send.begin() + p * mine.numel());
  }
  std::vector<size_t> send_counts(tp, mine.numel()), recv_counts(tp);
  int64_t total = 0;
  for (int p = 0; p < tp; ++p) {
    recv_counts[p] =
        n * (SplitOffset(num_heads_, tp, p + 1) - SplitOffset(num_heads_, tp, p)) * dv_;
    total += recv_counts[p];
  }
  std::vector<float> blocks(total);  // rank p's block: [n, heads_p·dv]
  comm_.AllToAllV(send.data(), send_counts, blocks.data(), recv_counts, DType::kF32);
  float* out = all.data_as<float>();
  const int64_t width_all = num_heads_ * dv_;
  int64_t offset = 0;
  for (int p = 0; p < tp; ++p) {
    const int64_t width = static_cast<int64_t>(recv_counts[p]) / std::max<int64_t>(n, 1);
    const int64_t col = SplitOffset(num_heads_, tp, p) * dv_;
    for (int64_t t = 0; t < n; ++t) {
      std::copy(blocks.begin() + offset + t * width, blocks.begin() + offset + (t + 1) * width,
                out + t * width_all + col);
    }
    offset += n * width;
  }
}

void TpGroup::AllGatherRows(const Tensor& rows) {
  const int tp = size(), me = rank();
  const int64_t n = rows.dim(0), h = rows.dim(1);
  AFD_CHECK(rows.device().is_cpu(), "attention TP over the host transport needs host tensors");
  const int64_t begin = SplitOffset(n, tp, me), count = SplitSize(n, tp, me);
  std::vector<float> mine(rows.data_as<const float>() + begin * h,
                          rows.data_as<const float>() + (begin + count) * h);
  std::vector<float> send(tp * mine.size());
  for (int p = 0; p < tp; ++p) std::copy(mine.begin(), mine.end(), send.begin() + p * mine.size());
  std::vector<size_t> send_counts(tp, mine.size()), recv_counts(tp);
  for (int p = 0; p < tp; ++p) recv_counts[p] = SplitSize(n, tp, p) * h;
  // Rank p's block lands at rows [SplitOffset(n, tp, p), ...): the layout of `rows`.
  comm_.AllToAllV(send.data(), send_counts, rows.data(), recv_counts, DType::kF32);
}

}  // namespace afd::roles

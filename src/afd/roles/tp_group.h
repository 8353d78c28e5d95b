// Attention tensor parallelism over a replica's TP communicator: rank r of tp attends heads
// [SplitOffset(heads, tp, r), SplitOffset(heads, tp, r + 1)) and owns the token rows
// [SplitOffset(n, tp, r), ...) of each MoE exchange (it alone sends them to the FFN role).
// Gathers go over the host communicator, so tensors are in host memory (the CPU backend).
// Thread safety: one thread (the rank's).
#pragma once

#include <cstdint>

#include "afd/comm/communicator.h"
#include "afd/model/model.h"

namespace afd::roles {

class TpGroup : public model::HeadParallel {
 public:
  // `comm` (the replica's TP group) must outlive this.
  TpGroup(comm::Communicator& comm, int64_t num_heads, int64_t v_head_dim);

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  int64_t head_begin() const override;
  int64_t head_end() const override;
  void AllGatherHeads(const Tensor& mine, const Tensor& all) override;
  // rows: [n, H]; on entry this rank's share of the rows is in place, on return every rank's.
  void AllGatherRows(const Tensor& rows);

 private:
  comm::Communicator& comm_;
  int64_t num_heads_, dv_;
};

}  // namespace afd::roles

// The MoE layer on the FFN role, with the routed experts sharded over the FFN ranks (expert
// parallelism). FFN rank f owns experts ExpertRangeOf(E, F, f) (topology/expert_range.h).
//
// Forward (collective over the EP group; every FFN rank calls it for every MoE layer of every
// step, with zero rows when it has none -- the dummy step of the arbitrary-ratio P2P design):
//   1. dispatch: each (token, slot) whose expert lives elsewhere goes to its owner, all-to-all;
//   2. each owner runs its experts on every row it holds (its own and received ones), grouped by
//      expert (the backend's MoePermute / GroupedExpertMlp);
//   3. combine: the unweighted expert outputs return to the token's home rank, which adds
//      weight x output over the token's slots in ascending expert order (MoeCombine), then the
//      shared experts.
// That is exactly the arithmetic of the in-process MoE over all experts, so an AFD deployment
// reproduces the monolithic model bit for bit.
//
// The routing bookkeeping (who sends which row where) is done on the host from a host copy of
// the ids; the counts go over `ep` (a host communicator), the rows and ids over `ep_rows`: the
// same communicator on the CPU, a device one (NCCL, on the backend's stream) on a GPU, whose
// tensors then stay in device memory. The one wait for the device per layer is the copy of the
// ids; that every rank splits the experts alike is checked once, when the group constructs it.
// Thread safety: one Forward at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "afd/comm/communicator.h"
#include "afd/model/model.h"

namespace afd::roles {

class ExpertParallelMoe {
 public:
  // `model`, `ep` and `ep_rows` (same group, same ranks; may be `ep` itself) must outlive this.
  // The experts this rank owns (and the shared experts) must be loaded in the model. Collective
  // over `ep`: checks that every rank has the same number of routed experts (throws naming it).
  ExpertParallelMoe(const model::MoeModel& model, comm::Communicator& ep,
                    comm::Communicator& ep_rows);

  int64_t expert_begin() const { return begin_; }
  int64_t expert_end() const { return end_; }

  // rows: [n, H] this rank's tokens of MoE layer `layer`; ids, weights: [n, k] routing (ids
  // ascending per token); out: [n, H] = routed experts (all of them) + shared experts.
  void Forward(int64_t layer, const Tensor& rows, const Tensor& ids, const Tensor& weights,
               const Tensor& out, Workspace& ws);

 private:
  const model::MoeModel& model_;
  comm::Communicator& ep_;
  comm::Communicator& ep_rows_;
  std::vector<int> owner_;  // [E] owning EP rank of each expert
  int64_t begin_, end_;
};

}  // namespace afd::roles

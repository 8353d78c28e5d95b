// Token-level dispatch of the asynchronous connector, as pure host arithmetic so it
// can be tested without a model or a window.
//
// Routing gives every token t its k experts ids[t, j]. One stable sort of the n*k (token, slot)
// pairs by (owning FFN rank, local expert) yields both groupings the wire needs: each FFN rank's
// pairs are one contiguous segment, grouped by its local experts, tokens ascending within an
// expert (the order MoePermute groups rows in). FFN rank f owns experts
// [SplitOffset(E, F, f), SplitOffset(E, F, f + 1)). A token's row goes to every rank owning one
// of its experts, once per such (token, expert) pair. Shared-expert tokens are split round robin:
// token t to FFN rank t % F.
#pragma once

#include <cstdint>
#include <vector>

namespace afd::connector {

struct DispatchPlan {
  int64_t num_tokens = 0, topk = 0;
  int num_ffn = 0;
  // [n*k] the pair (t*k + j) at each sorted position.
  std::vector<int32_t> pair_at;
  // [n*k] token of each sorted position (pair_at / k): the rows to gather, and the route table.
  std::vector<int32_t> token_at;
  // [n*k] sorted position of pair (t, j): the row_of_slot of MoeCombine.
  std::vector<int32_t> position;
  // [F+1] FFN rank f's pairs are sorted positions [segment[f], segment[f+1]).
  std::vector<int64_t> segment;
  // [F][local experts of f] pairs per local expert.
  std::vector<std::vector<int32_t>> expert_counts;
  // [F] shared-expert tokens of each FFN rank (empty without shared experts).
  std::vector<std::vector<int32_t>> shared_tokens;

  // Whether FFN rank f gets anything (routed or shared rows): only those are sent and awaited.
  bool HasWork(int f) const { return segment[f + 1] > segment[f] || !shared_tokens[f].empty(); }
};

// ids: [n, k] expert ids in [0, num_experts). Throws afd::Error naming the token and the id when
// an id is out of range.
DispatchPlan PlanDispatch(const int32_t* ids, int64_t n, int64_t k, int64_t num_experts,
                          int num_ffn, bool shared_experts);

}  // namespace afd::connector

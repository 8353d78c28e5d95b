#include "afd/connector/dispatch_plan.h"

#include "afd/common/error.h"
#include "afd/topology/expert_range.h"
#include "afd/topology/topology.h"

namespace afd::connector {

DispatchPlan PlanDispatch(const int32_t* ids, int64_t n, int64_t k, int64_t num_experts,
                          int num_ffn, bool shared_experts) {
  AFD_CHECK(n >= 0 && k >= 1 && num_ffn >= 1 && num_experts >= 1,
            "dispatch plan: bad shape (tokens {}, topk {}, experts {}, FFN ranks {})", n, k,
            num_experts, num_ffn);
  DispatchPlan p;
  p.num_tokens = n;
  p.topk = k;
  p.num_ffn = num_ffn;
  const int64_t pairs = n * k;
  // Global expert ids in ascending order are already ordered by (owner, local expert): a
  // counting sort over expert ids is the one stable sort.
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t s = 0; s < pairs; ++s) {
    AFD_CHECK(ids[s] >= 0 && ids[s] < num_experts,
              "dispatch plan: token {} slot {} is routed to expert {}, outside [0, {})", s / k,
              s % k, ids[s], num_experts);
    ++start[ids[s] + 1];
  }
  p.expert_counts.resize(num_ffn);
  p.segment.assign(num_ffn + 1, 0);
  for (int f = 0; f < num_ffn; ++f) {
    const ExpertRange r = ExpertRangeOf(num_experts, num_ffn, f);
    for (int64_t x = r.begin; x < r.end; ++x)
      p.expert_counts[f].push_back(static_cast<int32_t>(start[x + 1]));
  }
  for (int64_t x = 0; x < num_experts; ++x) start[x + 1] += start[x];
  for (int f = 0; f <= num_ffn; ++f) {
    p.segment[f] = start[SplitOffset(num_experts, num_ffn, f)];
  }
  p.pair_at.resize(pairs);
  p.token_at.resize(pairs);
  p.position.resize(pairs);
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t s = 0; s < pairs; ++s) {  // ascending (token, slot): stable
    const int64_t at = next[ids[s]]++;
    p.pair_at[at] = static_cast<int32_t>(s);
    p.token_at[at] = static_cast<int32_t>(s / k);
    p.position[s] = static_cast<int32_t>(at);
  }
  p.shared_tokens.resize(num_ffn);
  if (shared_experts) {
    for (int64_t t = 0; t < n; ++t) p.shared_tokens[t % num_ffn].push_back(static_cast<int32_t>(t));
  }
  return p;
}

}  // namespace afd::connector

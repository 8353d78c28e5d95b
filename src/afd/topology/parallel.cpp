#include "afd/topology/parallel.h"

#include "afd/common/error.h"

namespace afd {

void CheckParallelSizes(const ParallelSizes& s) {
  AFD_CHECK(s.dp >= 1, "data-parallel size must be >= 1, got {}", s.dp);
  AFD_CHECK(s.pcp >= 1, "prefill-context-parallel size must be >= 1, got {}", s.pcp);
  AFD_CHECK(s.tp >= 1, "tensor-parallel size must be >= 1, got {}", s.tp);
  const int64_t product = int64_t{s.dp} * s.pcp * s.tp;
  AFD_CHECK(product <= kMaxRanksPerRole, "DP {} x PCP {} x TP {} = {} ranks exceeds the limit {}",
            s.dp, s.pcp, s.tp, product, kMaxRanksPerRole);
}

int LinearizeRoleRank(const ParallelSizes& s, const ParallelCoords& c) {
  CheckParallelSizes(s);
  AFD_CHECK(c.dp_rank >= 0 && c.dp_rank < s.dp, "dp_rank {} is out of range 0..{}", c.dp_rank,
            s.dp - 1);
  AFD_CHECK(c.pcp_rank >= 0 && c.pcp_rank < s.pcp, "pcp_rank {} is out of range 0..{}", c.pcp_rank,
            s.pcp - 1);
  AFD_CHECK(c.tp_rank >= 0 && c.tp_rank < s.tp, "tp_rank {} is out of range 0..{}", c.tp_rank,
            s.tp - 1);
  return (c.dp_rank * s.pcp + c.pcp_rank) * s.tp + c.tp_rank;
}

ParallelCoords DelinearizeRoleRank(const ParallelSizes& s, int role_rank) {
  CheckParallelSizes(s);
  AFD_CHECK(role_rank >= 0 && role_rank < s.num_ranks(), "role rank {} is out of range 0..{}",
            role_rank, s.num_ranks() - 1);
  ParallelCoords c;
  c.tp_rank = role_rank % s.tp;
  c.pcp_rank = (role_rank / s.tp) % s.pcp;
  c.dp_rank = role_rank / (s.tp * s.pcp);
  return c;
}

void CheckRankRule(Role role, int configured_ranks, const ParallelSizes& s) {
  CheckParallelSizes(s);
  AFD_CHECK(configured_ranks == s.num_ranks(),
            "{0} ranks must equal DP x PCP x TP of the {0} server: num_{0}_ranks={1} but DP {2} x "
            "PCP {3} x TP {4} = {5}",
            RoleName(role), configured_ranks, s.dp, s.pcp, s.tp, s.num_ranks());
}

std::vector<int64_t> ExpandTokenCounts(const std::vector<int64_t>& counts, int num_ranks) {
  AFD_CHECK(num_ranks >= 1, "token counts: rank count must be >= 1, got {}", num_ranks);
  AFD_CHECK(!counts.empty(), "token counts: the vector is empty");
  for (size_t i = 0; i < counts.size(); ++i) {
    AFD_CHECK(counts[i] >= 0, "token counts: entry {} is negative ({})", i, counts[i]);
  }
  const int n = static_cast<int>(counts.size());
  if (n == num_ranks) return counts;
  AFD_CHECK(n < num_ranks && num_ranks % n == 0,
            "token counts: {} entries fit neither {} ranks nor a per-DP vector whose size "
            "divides {}",
            n, num_ranks, num_ranks);
  const int per_replica = num_ranks / n;
  std::vector<int64_t> expanded;
  expanded.reserve(num_ranks);
  for (int64_t c : counts) expanded.insert(expanded.end(), per_replica, c);
  return expanded;
}

}  // namespace afd

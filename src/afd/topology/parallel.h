// Parallelism inside one role: how a role rank is built from data-, prefill-context- and
// tensor-parallel coordinates, the rank rule of the deployment topologies, and the expansion of
// per-DP token counts across the ranks of each DP replica (the P2P connector's metadata).
//
//   role_rank = (dp_rank * pcp + pcp_rank) * tp + tp_rank
//
// Thread safety: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "afd/topology/topology.h"

namespace afd {

// Sizes of the parallel dimensions of one role's server. All must be >= 1.
struct ParallelSizes {
  int dp = 1;
  int pcp = 1;
  int tp = 1;
  int num_ranks() const { return dp * pcp * tp; }
};

// Coordinates of one rank inside those dimensions.
struct ParallelCoords {
  int dp_rank = 0;
  int pcp_rank = 0;
  int tp_rank = 0;
  bool operator==(const ParallelCoords&) const = default;
};

// Throws afd::Error naming the dimension when a size is < 1 or the product overflows
// kMaxRanksPerRole.
void CheckParallelSizes(const ParallelSizes& sizes);

// role_rank = (dp_rank*pcp + pcp_rank)*tp + tp_rank. Throws afd::Error naming the coordinate
// when one is outside [0, size).
int LinearizeRoleRank(const ParallelSizes& sizes, const ParallelCoords& coords);

// Inverse of LinearizeRoleRank. Throws afd::Error when role_rank is outside [0, num_ranks).
ParallelCoords DelinearizeRoleRank(const ParallelSizes& sizes, int role_rank);

// The rank rule: the configured rank count of a role equals DP x PCP x TP of its server.
// Throws afd::Error naming the role and both numbers otherwise.
void CheckRankRule(Role role, int configured_ranks, const ParallelSizes& sizes);

// Expands a token-count vector to one entry per role rank. A vector with one entry per rank is
// returned as is; one with one entry per DP replica (num_ranks a multiple of its size) has each
// entry repeated num_ranks / size times, since every TP/PCP peer of a replica sees the same
// tokens. Throws afd::Error for an empty vector, a negative count or a size that fits neither.
std::vector<int64_t> ExpandTokenCounts(const std::vector<int64_t>& counts, int num_ranks);

}  // namespace afd

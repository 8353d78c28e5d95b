#include "afd/topology/expert_range.h"

#include "afd/common/error.h"
#include "afd/topology/topology.h"

namespace afd {

ExpertRange ExpertRangeOf(int64_t num_experts, int num_ranks, int rank) {
  AFD_CHECK(num_experts >= 0, "expert range: the expert count must be >= 0, got {}", num_experts);
  AFD_CHECK(num_ranks >= 1, "expert range: the rank count must be >= 1, got {}", num_ranks);
  AFD_CHECK(rank >= 0 && rank < num_ranks, "expert range: rank {} is outside [0, {})", rank,
            num_ranks);
  return {SplitOffset(num_experts, num_ranks, rank), SplitOffset(num_experts, num_ranks, rank + 1)};
}

}  // namespace afd

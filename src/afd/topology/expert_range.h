// Which rank owns which routed experts: the one rule of every expert-sharded role (AFD's FFN
// ranks, DP + EP's ranks), used by the weight loader, the dispatch (CPU reference and CUDA
// kernels), the connectors and the expert-parallel exchange.
//
//   rank r of R owns the contiguous experts [SplitOffset(E, R, r), SplitOffset(E, R, r + 1)):
//   the first E % R ranks hold one expert more.
//
// Thread safety: pure functions; safe from any thread.
// (C++17: CUDA files include it.)
#pragma once

#include <cstdint>

#include "afd/common/host_device.h"

namespace afd {

// Experts [begin, end).
struct ExpertRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t e) const { return e >= begin && e < end; }
  bool operator==(const ExpertRange& o) const { return begin == o.begin && end == o.end; }
};

// Rank `rank` of `num_ranks`'s experts among `num_experts`. Throws afd::Error for
// num_experts < 0, num_ranks < 1 or a rank outside [0, num_ranks).
ExpertRange ExpertRangeOf(int64_t num_experts, int num_ranks, int rank);

// The rank that owns expert e: the r with e in ExpertRangeOf(E, R, r). Unchecked (callers hold
// 0 <= e < E and R >= 1; the kernels call it per routed slot).
AFD_HOST_DEVICE inline int ExpertOwner(int64_t e, int64_t num_experts, int num_ranks) {
  const int64_t q = num_experts / num_ranks, rem = num_experts % num_ranks;
  const int64_t big = rem * (q + 1);  // the experts of the ranks holding q + 1
  return static_cast<int>(e < big ? e / (q + 1) : rem + (e - big) / q);
}

}  // namespace afd

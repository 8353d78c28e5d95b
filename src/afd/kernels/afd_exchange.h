// The rank arithmetic of the AFD exchange ops (Backend::AfdDispatch and friends), shared by the
// CPU reference and the CUDA kernels: which FFN rank owns an expert, and the rows a rank gets.
#pragma once

#include <cstdint>

#include "afd/common/fp8_rows.h"

namespace afd::kernels {

// The FFN rank f of F with SplitOffset(E, F, f) <= e < SplitOffset(E, F, f + 1) (the first
// E % F ranks hold one expert more).
AFD_HOST_DEVICE inline int AfdOwner(int64_t e, int64_t num_experts, int num_ranks) {
  const int64_t q = num_experts / num_ranks, rem = num_experts % num_ranks;
  const int64_t big = rem * (q + 1);
  return static_cast<int>(e < big ? e / (q + 1) : rem + (e - big) / q);
}

// Tokens t < n with t % F == f: the first rows of rank f (their shared experts run there).
AFD_HOST_DEVICE inline int64_t AfdOwnedTokens(int64_t n, int num_ranks, int f) {
  return n > f ? (n - f + num_ranks - 1) / num_ranks : 0;
}

}  // namespace afd::kernels

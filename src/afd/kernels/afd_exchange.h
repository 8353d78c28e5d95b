// The rank arithmetic of the AFD exchange ops (Backend::AfdDispatch and friends), shared by the
// CPU reference and the CUDA kernels: the rows a rank gets (which FFN rank owns an expert is
// topology/expert_range.h's ExpertOwner).
#pragma once

#include <cstdint>

#include "afd/common/fp8_rows.h"
#include "afd/topology/expert_range.h"

namespace afd::kernels {

// Tokens t < n with t % F == f: the first rows of rank f (their shared experts run there).
AFD_HOST_DEVICE inline int64_t AfdOwnedTokens(int64_t n, int num_ranks, int f) {
  return n > f ? (n - f + num_ranks - 1) / num_ranks : 0;
}

}  // namespace afd::kernels

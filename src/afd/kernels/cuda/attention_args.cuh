// The arguments the paged-cache attention kernels share (MLA and GQA): the rope and each token's
// place in the paged cache.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// The rotary embedding of one call.
struct RopeArgs {
  const float* inv_freq;  // [dr/2]
  int64_t dim;            // dr
  float factor;
  bool interleave;
};
// The step's tokens over the paged cache (AttentionTokens as raw pointers).
struct PagedArgs {
  const int64_t* positions;
  const int32_t* seq_index;
  const int64_t* slot_mapping;
  const int32_t* block_tables;
  int64_t max_blocks;
  int64_t block_size;
};

}  // namespace afd::kernels::cuda

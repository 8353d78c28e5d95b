// Small CUDA kernels of `afd connector-test --device cuda`: the known "FFN function" applied to
// rows on the device, y = 3x + 1 on the raw bits of each element (2- or 4-byte elements).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace afd::comm_nccl {

// Enqueues the function on `stream` for `count` elements of `width` bytes (2 or 4) at `data`.
cudaError_t LaunchSelftestFfnFunction(void* data, size_t count, size_t width, cudaStream_t stream);

}  // namespace afd::comm_nccl

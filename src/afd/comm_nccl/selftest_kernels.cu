#include <cstdint>

#include "afd/comm_nccl/selftest_kernels.h"

namespace afd::comm_nccl {

namespace {

template <typename T>
__global__ void ThreeXPlusOne(T* data, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    data[i] = static_cast<T>(3u * data[i] + 1u);
  }
}

}  // namespace

cudaError_t LaunchSelftestFfnFunction(void* data, size_t count, size_t width, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = static_cast<int>(
      (count + threads - 1) / threads < 1024 ? (count + threads - 1) / threads : 1024);
  if (width == 2) {
    ThreeXPlusOne<<<blocks, threads, 0, stream>>>(static_cast<uint16_t*>(data), count);
  } else if (width == 4) {
    ThreeXPlusOne<<<blocks, threads, 0, stream>>>(static_cast<uint32_t*>(data), count);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace afd::comm_nccl

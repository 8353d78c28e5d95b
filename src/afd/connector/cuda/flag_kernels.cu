#include <cuda_runtime.h>

#include "afd/connector/cuda/flag_kernels.h"

namespace afd::connector {

namespace {

// One thread: every earlier write of this stream (kernels and copies ended before this kernel
// started) is made visible system-wide, then the flag is stored.
__global__ void StoreFlag(volatile unsigned long long* flag, unsigned long long value) {
  __threadfence_system();
  *flag = value;
}

// One thread polls the flag (host-mapped memory, read through the bus each time) until it
// reaches `value`; kernels after it on the stream start once it ends.
__global__ void AwaitFlag(const volatile unsigned long long* flag, unsigned long long value) {
  while (*flag < value) __nanosleep(200);
  __threadfence_system();
}

}  // namespace

bool LaunchStoreFlag(void* stream, uint64_t* device_flag, uint64_t value) {
  StoreFlag<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<volatile unsigned long long*>(device_flag), value);
  return cudaGetLastError() == cudaSuccess;
}

bool LaunchAwaitFlag(void* stream, const uint64_t* device_flag, uint64_t value) {
  AwaitFlag<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const volatile unsigned long long*>(device_flag), value);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace afd::connector

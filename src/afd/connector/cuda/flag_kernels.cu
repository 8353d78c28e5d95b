#include <cuda_runtime.h>

#include <cstdio>

#include "afd/connector/cuda/flag_kernels.h"

namespace afd::connector {

namespace {

// One thread: every earlier write of this stream (kernels and copies ended before this kernel
// started) is made visible system-wide, then the flag is stored.
__global__ void StoreFlag(volatile unsigned long long* flag, unsigned long long value) {
  __threadfence_system();
  *flag = value;
}

__device__ unsigned long long GlobalNanos() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread polls the flag (host-mapped memory, read through the bus each time) until it
// reaches `value`; kernels after it on the stream start once it ends. Bounded: after
// timeout_ns (0: none) it gives up, says so, and ends (the host, which checks every flag with
// its own deadline and names the peer, then fails the step).
__global__ void AwaitFlag(const volatile unsigned long long* flag, unsigned long long value,
                          unsigned long long timeout_ns) {
  const unsigned long long start = GlobalNanos();
  while (*flag < value) {
    if (timeout_ns != 0 && GlobalNanos() - start > timeout_ns) {
      printf("afd: a CUDA stream's flag wait gave up after %llu ms (flag %llu, awaited %llu)\n",
             timeout_ns / 1000000ull, *flag, value);
      break;
    }
    __nanosleep(200);
  }
  __threadfence_system();
}

}  // namespace

bool LaunchStoreFlag(void* stream, uint64_t* device_flag, uint64_t value) {
  StoreFlag<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<volatile unsigned long long*>(device_flag), value);
  return cudaGetLastError() == cudaSuccess;
}

bool LaunchAwaitFlag(void* stream, const uint64_t* device_flag, uint64_t value, double timeout_s) {
  const auto timeout_ns = static_cast<unsigned long long>(timeout_s > 0 ? timeout_s * 1e9 : 0);
  AwaitFlag<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const volatile unsigned long long*>(device_flag), value, timeout_ns);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace afd::connector

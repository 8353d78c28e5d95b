#include "afd/connector/cuda/stream_flags.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "afd/common/cuda_check.h"
#include "afd/common/cuda_driver.h"
#include "afd/common/error.h"
#include "afd/connector/cuda/flag_kernels.h"

namespace afd::connector {

namespace {

using WriteFn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using AttrFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);

}  // namespace

std::unique_ptr<StreamFlags> StreamFlags::Create(int device, std::string* why,
                                                 double wait_timeout_s) {
  std::string unused;
  if (why == nullptr) why = &unused;
  AFD_CUDA_CHECK(cudaSetDevice(device));
  int mapped = 0;
  AFD_CUDA_CHECK(cudaDeviceGetAttribute(&mapped, cudaDevAttrCanMapHostMemory, device));
  if (mapped == 0) {
    *why = fmt::format("cuda:{} cannot map host memory", device);
    return nullptr;
  }
  std::unique_ptr<StreamFlags> f(new StreamFlags());
  f->device_ = device;
  f->wait_timeout_s_ = wait_timeout_s;
  // Stream memory operations when the device runs them (measured on an H200: a few us less per
  // round trip than the kernels); else the one-thread kernels.
  auto* attr = reinterpret_cast<AttrFn>(CudaDriverFunction("cuDeviceGetAttribute", why));
  int mem_ops = 0;
  if (attr != nullptr &&
      attr(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device) == CUDA_SUCCESS &&
      mem_ops != 0) {
    f->write_fn_ = CudaDriverFunction("cuStreamWriteValue64", why);
    f->wait_fn_ = CudaDriverFunction("cuStreamWaitValue64", why);
  }
  f->memops_ = f->write_fn_ != nullptr && f->wait_fn_ != nullptr;
  return f;
}

StreamFlags::~StreamFlags() {
  cudaSetDevice(device_);
  for (const Range& r : ranges_) cudaHostUnregister(r.host);
  for (void* c : counters_) cudaFree(c);
  if (status_ != nullptr) cudaFreeHost(status_);
}

uint64_t* StreamFlags::DeviceCounters(size_t n) {
  AFD_CUDA_CHECK(cudaSetDevice(device_));
  if (status_ == nullptr) {
    void* s = nullptr;
    AFD_CUDA_CHECK(cudaHostAlloc(&s, sizeof(DeviceSlotStatus), cudaHostAllocMapped));
    std::memset(s, 0, sizeof(DeviceSlotStatus));
    status_ = static_cast<DeviceSlotStatus*>(s);
    void* d = nullptr;
    AFD_CUDA_CHECK(cudaHostGetDevicePointer(&d, s, 0));
    status_device_ = static_cast<DeviceSlotStatus*>(d);
  }
  void* c = nullptr;
  AFD_CUDA_CHECK(cudaMalloc(&c, std::max<size_t>(n, 1) * 8));
  counters_.push_back(c);
  AFD_CUDA_CHECK(cudaMemset(c, 0, std::max<size_t>(n, 1) * 8));
  AFD_CUDA_CHECK(cudaDeviceSynchronize());
  return static_cast<uint64_t*>(c);
}

void StreamFlags::Publish(void* stream, char* header_dst, uint64_t* flag_dst, char* dev_header_dst,
                          uint64_t* dev_flag_dst, const void* header, uint64_t* counter,
                          const uint64_t* echo_src) const {
  AFD_CHECK(LaunchPublishSlot(stream, reinterpret_cast<void*>(DeviceAddress(header_dst, 56)),
                              reinterpret_cast<uint64_t*>(DeviceAddress(flag_dst)), dev_header_dst,
                              dev_flag_dst, header, counter, echo_src),
            "slot publish kernel on cuda:{}: {}", device_, cudaGetErrorString(cudaGetLastError()));
}

void StreamFlags::AwaitSlot(void* stream, const uint64_t* flag, const char* header, uint64_t* seen,
                            uint64_t seq, const uint64_t* echo_counter,
                            const DeviceSlotExpect& expect, int region, int ring) const {
  AFD_CHECK(status_device_ != nullptr, "stream flags: AwaitSlot before DeviceCounters");
  AFD_CHECK(LaunchAwaitSlot(stream, flag, header, seen, seq, echo_counter, expect, status_device_,
                            region, ring, wait_timeout_s_),
            "slot wait kernel on cuda:{}: {}", device_, cudaGetErrorString(cudaGetLastError()));
}

void StreamFlags::Abort(int region) {
  if (status_ == nullptr) return;
  volatile DeviceSlotStatus* s = status_;
  if (s->code != DeviceSlotStatus::kOk) return;
  s->region = region;
  s->ring = -1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint32_t expected = DeviceSlotStatus::kOk;
  __atomic_compare_exchange_n(&status_->code, &expected,
                              static_cast<uint32_t>(DeviceSlotStatus::kAborted), false,
                              __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

void StreamFlags::Register(char* base, size_t bytes, const std::string& what) {
  AFD_CUDA_CHECK(cudaSetDevice(device_));
  const cudaError_t e =
      cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  AFD_CHECK(e == cudaSuccess, "cannot register the flags of {} with cuda:{}: {}", what, device_,
            cudaGetErrorString(e));
  void* dev = nullptr;
  AFD_CUDA_CHECK(cudaHostGetDevicePointer(&dev, base, 0));
  ranges_.push_back({base, bytes, reinterpret_cast<uint64_t>(dev)});
}

uint64_t StreamFlags::DeviceAddress(const void* host, size_t bytes) const {
  const char* p = static_cast<const char*>(host);
  for (const Range& r : ranges_) {
    if (p >= r.host && p + bytes <= r.host + r.bytes) return r.device + (p - r.host);
  }
  AFD_THROW("stream flags: host address {} is in no registered flag range", host);
}

void StreamFlags::Write(void* stream, uint64_t* flag, uint64_t value) const {
  Store(stream, DeviceAddress(flag), value);
}

void StreamFlags::Wait(void* stream, const uint64_t* flag, uint64_t value) const {
  Await(stream, DeviceAddress(flag), value);
}

void StreamFlags::Store(void* stream, uint64_t address, uint64_t value) const {
  if (!memops_) {
    AFD_CHECK(LaunchStoreFlag(stream, reinterpret_cast<uint64_t*>(address), value),
              "flag store kernel on cuda:{}: {}", device_, cudaGetErrorString(cudaGetLastError()));
    return;
  }
  const CUresult r = reinterpret_cast<WriteFn>(write_fn_)(static_cast<CUstream>(stream), address,
                                                          value, CU_STREAM_WRITE_VALUE_DEFAULT);
  AFD_CHECK(r == CUDA_SUCCESS, "cuStreamWriteValue64 on cuda:{} failed (CUresult {})", device_,
            static_cast<int>(r));
}

void StreamFlags::Await(void* stream, uint64_t address, uint64_t value) const {
  if (!memops_) {
    AFD_CHECK(
        LaunchAwaitFlag(stream, reinterpret_cast<const uint64_t*>(address), value, wait_timeout_s_),
        "flag wait kernel on cuda:{}: {}", device_, cudaGetErrorString(cudaGetLastError()));
    return;
  }
  const CUresult r = reinterpret_cast<WaitFn>(wait_fn_)(static_cast<CUstream>(stream), address,
                                                        value, CU_STREAM_WAIT_VALUE_GEQ);
  AFD_CHECK(r == CUDA_SUCCESS, "cuStreamWaitValue64 on cuda:{} failed (CUresult {})", device_,
            static_cast<int>(r));
}

}  // namespace afd::connector

// Device rows for `afd connector-test --device cuda` (CUDA + NCCL builds).
#include "afd/common/cuda_check.h"
#include "afd/common/error.h"
#include "afd/diag/row_io.h"

#if AFD_WITH_NCCL
#include <cuda_runtime.h>

#include "afd/comm_nccl/nccl_communicator.h"
#include "afd/comm_nccl/selftest_kernels.h"
#include "afd/connector/cuda/flag_kernels.h"

namespace afd::diag {

namespace {

constexpr double kHoldBoundS = 600;  // a connector-test stream hold, at most

class DeviceRowIo : public RowIo {
 public:
  DeviceRowIo(int device, cudaStream_t stream) : stream_(stream) {
    AFD_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceRowIo() override {
    for (auto& b : buffers_) {
      if (b.ptr) cudaFree(b.ptr);
    }
    for (cudaEvent_t e : events_) {
      if (e) cudaEventDestroy(e);
    }
    if (gate_) {
      Release();  // a stream still held drains
      cudaStreamSynchronize(stream_);
      cudaFreeHost(const_cast<uint64_t*>(gate_));
    }
  }
  void Hold() override {
    if (!gate_) {
      void* p = nullptr;
      AFD_CUDA_CHECK(cudaHostAlloc(&p, 64, cudaHostAllocMapped));
      gate_ = static_cast<volatile uint64_t*>(p);
      *gate_ = 0;
      AFD_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_gate_), p, 0));
    }
    ++gate_seq_;
    // The host releases this gate itself (Release); the bound only keeps a wedged test from
    // holding the GPU forever.
    AFD_CHECK(connector::LaunchAwaitFlag(stream_, device_gate_, gate_seq_, kHoldBoundS),
              "connector-test rows: the stream hold failed to launch: {}",
              cudaGetErrorString(cudaGetLastError()));
  }
  void Release() override {
    if (gate_) *gate_ = gate_seq_;
  }
  void Mark(int which) override {
    cudaEvent_t& e = events_[which & 1];
    if (!e) AFD_CUDA_CHECK(cudaEventCreate(&e));
    AFD_CUDA_CHECK(cudaEventRecord(e, stream_));
  }
  double MarkedMicros() override {
    float ms = 0;
    AFD_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[1]));
    return 1e3 * ms;
  }
  void* Buffer(size_t bytes, int slot) override {
    Buf& b = buffers_[slot & 1];
    if (b.bytes < bytes) {
      if (b.ptr) AFD_CUDA_CHECK(cudaFree(b.ptr));
      AFD_CUDA_CHECK(cudaMalloc(&b.ptr, bytes));
      b.bytes = bytes;
    }
    if (!b.ptr) {  // zero bytes: still a valid device pointer
      AFD_CUDA_CHECK(cudaMalloc(&b.ptr, 256));
      b.bytes = 256;
    }
    return b.ptr;
  }
  void Upload(void* dst, const std::vector<char>& src) override {
    if (!src.empty()) {
      AFD_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size(), cudaMemcpyHostToDevice, stream_));
    }
  }
  void Download(std::vector<char>& dst, const void* src, size_t bytes) override {
    dst.resize(bytes);
    if (bytes) {
      AFD_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    AFD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void Synchronize(double timeout_s) override {
    comm_nccl::SynchronizeStream(stream_, timeout_s, "connector-test rows");
  }
  void ApplyFfnFunction(void* data, size_t count, size_t width) override {
    AFD_CUDA_CHECK(comm_nccl::LaunchSelftestFfnFunction(data, count, width, stream_));
  }

 private:
  struct Buf {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  cudaStream_t stream_;
  Buf buffers_[2];
  cudaEvent_t events_[2] = {nullptr, nullptr};
  volatile uint64_t* gate_ = nullptr;  // Hold's flag (mapped host memory)
  uint64_t* device_gate_ = nullptr;    // its device address
  uint64_t gate_seq_ = 0;
};

}  // namespace

std::unique_ptr<RowIo> MakeDeviceRowIo(int cuda_device, void* stream) {
  return std::make_unique<DeviceRowIo>(cuda_device, static_cast<cudaStream_t>(stream));
}

}  // namespace afd::diag

#else

namespace afd::diag {

std::unique_ptr<RowIo> MakeDeviceRowIo(int, void*) {
  AFD_THROW("--device cuda: this afd was built without CUDA and NCCL");
}

}  // namespace afd::diag

#endif

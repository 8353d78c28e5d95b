#include "afd/connector/cuda/cuda_ipc_window.h"

#include <cuda_runtime.h>

#include <cstring>

#include "afd/common/cuda_check.h"
#include "afd/common/error.h"

namespace afd::connector {

namespace {

std::string Hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[b[i] >> 4]);
    s.push_back(digits[b[i] & 15]);
  }
  return s;
}

bool Unhex(const std::string& s, void* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto* b = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    int v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = s[2 * i + k];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    b[i] = static_cast<unsigned char>(v);
  }
  return true;
}

}  // namespace

std::unique_ptr<CudaIpcWindow> CudaIpcWindow::Create(comm::AfdWorld& world, size_t bytes,
                                                     const std::vector<int>& peers,
                                                     int cuda_device) {
  const int self = world.world_rank();
  const std::string me = world.Describe(self);
  std::unique_ptr<CudaIpcWindow> w(
      new CudaIpcWindow(bytes, world.topology().world_size(), self, cuda_device));
  AFD_CUDA_CHECK(cudaSetDevice(cuda_device));
  void* mem = nullptr;
  const cudaError_t e = cudaMalloc(&mem, bytes);
  AFD_CHECK(e == cudaSuccess, "{}: cannot allocate its {:.1f} MiB CUDA IPC window on cuda:{}: {}",
            me, bytes / 1048576.0, cuda_device, cudaGetErrorString(e));
  w->maps_[self] = static_cast<char*>(mem);
  AFD_CUDA_CHECK(cudaMemset(mem, 0, bytes));
  w->CreateStream();
  cudaIpcMemHandle_t handle;
  AFD_CUDA_CHECK(cudaIpcGetMemHandle(&handle, mem));
  comm::PrefixStore store(world.store(), "async_dwindow");
  store.Set(std::to_string(self), Hex(&handle, sizeof(handle)));
  const double timeout = world.config().afd_process_group_timeout_s;
  for (int p : peers) {
    const std::string text = store.Get(std::to_string(p), timeout);
    cudaIpcMemHandle_t h;
    AFD_CHECK(Unhex(text, &h, sizeof(h)), "{}: {} published a malformed CUDA IPC handle", me,
              world.Describe(p));
    void* ptr = nullptr;
    const cudaError_t o = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
    AFD_CHECK(o == cudaSuccess,
              "{} (cuda:{}) cannot open the CUDA IPC window of {}: {} -- the async connector's "
              "GPU windows need the processes on one node, on one GPU or GPUs with peer access",
              me, cuda_device, world.Describe(p), cudaGetErrorString(o));
    w->maps_[p] = static_cast<char*>(ptr);
  }
  return w;
}

CudaIpcWindow::~CudaIpcWindow() {
  DrainStream();
  for (size_t r = 0; r < maps_.size(); ++r) {
    if (!maps_[r]) continue;
    if (static_cast<int>(r) == self_) {
      cudaFree(maps_[r]);
    } else {
      cudaIpcCloseMemHandle(maps_[r]);
    }
  }
}

}  // namespace afd::connector

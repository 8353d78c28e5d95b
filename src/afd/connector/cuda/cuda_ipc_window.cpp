#include "afd/connector/cuda/cuda_ipc_window.h"

#include <cuda_runtime.h>

#include <cstring>

#include "afd/common/cuda_check.h"
#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::connector {

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
  // Zeroed before any peer can map it (cudaMemset may return before it ran, and the streams
  // that later use the window do not wait for the legacy one).
  AFD_CUDA_CHECK(cudaDeviceSynchronize());
  w->CreateStream();
  cudaIpcMemHandle_t handle;
  AFD_CUDA_CHECK(cudaIpcGetMemHandle(&handle, mem));
  comm::PrefixStore store(world.store(), "async_dwindow");
  store.Set(std::to_string(self),
            ToHex(std::string_view(reinterpret_cast<const char*>(&handle), sizeof(handle))));
  const double timeout = world.config().afd_process_group_timeout_s;
  for (int p : peers) {
    const std::string text = store.Get(std::to_string(p), timeout);
    const std::optional<std::string> bytes = FromHex(text);
    cudaIpcMemHandle_t h;
    AFD_CHECK(bytes && bytes->size() == sizeof(h), "{}: {} published a malformed CUDA IPC handle",
              me, world.Describe(p));
    std::memcpy(&h, bytes->data(), sizeof(h));
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

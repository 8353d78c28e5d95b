// The row window of the asynchronous connector on GPUs of one node through CUDA IPC: every rank
// allocates `bytes` of device memory, publishes its IPC handle in the rendezvous store
// ("async_dwindow/<world rank>"), and opens the handles of the peers it writes to -- processes
// on the same GPU or on GPUs with peer access. Copies, flags and streams: DeviceRowWindow.
#pragma once

#include <memory>

#include "afd/comm/afd_world.h"
#include "afd/connector/cuda/device_row_window.h"

namespace afd::connector {

class CudaIpcWindow : public DeviceRowWindow {
 public:
  // Collective over every world rank (each with the same `bytes`): allocates on `cuda_device`
  // and opens the copies of `peers` (world ranks). Throws afd::Error naming the rank and the
  // CUDA error (e.g. no peer access between the GPUs).
  static std::unique_ptr<CudaIpcWindow> Create(comm::AfdWorld& world, size_t bytes,
                                               const std::vector<int>& peers, int cuda_device);
  ~CudaIpcWindow() override;

 private:
  CudaIpcWindow(size_t bytes, int world_size, int self, int device)
      : DeviceRowWindow("CUDA IPC", bytes, world_size, self, device) {}
};

}  // namespace afd::connector

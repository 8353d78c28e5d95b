// The row window of the asynchronous connector in NCCL symmetric memory (NCCL >= 2.28 device
// API): the world's ranks form one NCCL communicator (one GPU per rank), each allocates its copy
// with ncclMemAlloc and registers it collectively (ncclCommWindowRegister, symmetric); NCCL
// maps the copies of every rank of this rank's load/store team (LSA: GPUs joined by NVLink) into
// this process, and a small kernel reads their addresses once (ncclGetLsaPointer). From then on
// a Write is a device-to-device copy into the peer's memory, as in CUDA IPC windows
// (DeviceRowWindow: copies, streams, flags in the host window).
//
// Peers outside the LSA team (another node) would need NCCL's GIN put-with-signal, with the
// flags in the window itself; that path is not implemented, and such a peer is refused at
// creation naming it. The binary runs only on the exact NCCL version it was built against
// (NcclDeviceApiMismatch): the window's device-side layout is compiled in.
#pragma once

#include <memory>

#include "afd/comm/afd_world.h"
#include "afd/connector/cuda/device_row_window.h"

namespace afd::connector {

class NcclWindow : public DeviceRowWindow {
 public:
  // Collective over every world rank (each with the same `bytes`, each on its own GPU): creates
  // the communicator, allocates and registers the window on `cuda_device`, maps `peers` (world
  // ranks). Throws afd::Error naming the rank and the cause (NCCL version, shared GPU, peer
  // outside the NVLink domain, NCCL errors, timeouts).
  static std::unique_ptr<NcclWindow> Create(comm::AfdWorld& world, size_t bytes,
                                            const std::vector<int>& peers, int cuda_device);
  ~NcclWindow() override;

 private:
  NcclWindow(size_t bytes, int world_size, int self, int device)
      : DeviceRowWindow("NCCL symmetric", bytes, world_size, self, device) {}

  void* comm_ = nullptr;    // ncclComm_t
  void* window_ = nullptr;  // ncclWindow_t
};

}  // namespace afd::connector

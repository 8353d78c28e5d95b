// The CUDA side of a rank for `--device cuda`: its device, its stream, and the communicator
// factory that puts the data plane on NCCL while the control plane and everything else stay on
// the host transport.
#pragma once

#include "afd/comm/afd_world.h"

namespace afd::deploy {

struct DeviceContext {
  comm::CommunicatorFactory factory;  // null: every group on the host transport
  int cuda_device = -1;
  void* stream = nullptr;  // cudaStream_t
};

// cuda_device < 0: world_rank modulo the number of devices. `stream`: the cudaStream_t the NCCL
// groups enqueue on (the model backend's, so transfers and kernels are ordered without host
// waits); null: a new one. Groups named "afd_subgroup_*" (the P2P data plane) and "afd_nccl_*"
// (device rows of other groups, e.g. the FFN role's expert-parallel all-to-alls) go on NCCL,
// every other group on the host transport. Throws afd::Error in builds without CUDA and NCCL,
// or when no CUDA device is usable.
DeviceContext MakeDeviceContext(int cuda_device, int world_rank, void* stream = nullptr);

}  // namespace afd::deploy

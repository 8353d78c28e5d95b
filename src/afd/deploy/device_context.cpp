#include "afd/deploy/device_context.h"

#include "afd/common/error.h"

#if AFD_WITH_NCCL
#include <cuda_runtime.h>

#include "afd/comm_nccl/nccl_communicator.h"

namespace afd::deploy {

DeviceContext MakeDeviceContext(int cuda_device, int world_rank, void* given_stream) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  AFD_CHECK(e == cudaSuccess && count > 0, "--device cuda: no usable CUDA device ({})",
            e == cudaSuccess ? "none found" : cudaGetErrorString(e));
  DeviceContext d;
  d.cuda_device = cuda_device >= 0 ? cuda_device : world_rank % count;
  AFD_CHECK(d.cuda_device < count, "--cuda-device {}: only {} device(s) visible", d.cuda_device,
            count);
  AFD_CHECK(cudaSetDevice(d.cuda_device) == cudaSuccess, "cannot use CUDA device {}",
            d.cuda_device);
  cudaStream_t stream = static_cast<cudaStream_t>(given_stream);
  if (stream == nullptr) {
    AFD_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess,
              "cannot create a CUDA stream on device {}", d.cuda_device);
  }
  d.stream = stream;
  const int device = d.cuda_device;
  d.factory = [device, stream](comm::Store& store,
                               const comm::GroupSpec& spec) -> std::unique_ptr<comm::Communicator> {
    if (spec.name.rfind("afd_subgroup_", 0) == 0 || spec.name.rfind("afd_nccl_", 0) == 0) {
      return comm_nccl::NcclCommunicator::Create(store, spec, device, stream);
    }
    return comm::TcpCommunicator::Create(store, spec);
  };
  return d;
}

}  // namespace afd::deploy

#else

namespace afd::deploy {

DeviceContext MakeDeviceContext(int, int, void*) {
  AFD_THROW(
      "--device cuda: this afd was built without CUDA and NCCL (configure with nvcc and "
      "NCCL present)");
}

}  // namespace afd::deploy

#endif

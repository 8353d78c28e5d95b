#include "afd/deploy/transport.h"

#include "afd/common/error.h"
#include "afd/config/connector_options.h"

namespace afd::deploy {

void CheckConnectorImplemented(const AfdConfig& config, bool cuda) {
  AFD_CHECK(!cuda || config.connector != kP2pHostConnector,
            "afd.connector {} on --device cuda: it moves host rows over TCP; GPU ranks use "
            "P2pNcclAFDConnector (one GPU per rank) or AsyncAFDConnector (CUDA IPC or NCCL "
            "windows)",
            config.connector);
  AFD_CHECK(cuda || config.connector != kGpuAsyncConnector,
            "afd.connector {} keeps its rows in GPU memory: run the ranks with --device cuda, or "
            "use AsyncAFDConnector (POSIX shared memory windows on the CPU)",
            config.connector);
  AFD_CHECK(cuda || !config.is_async() || config.async_options.window != "nccl",
            "afd.connector_extra_config.window \"nccl\" puts the rows in NCCL symmetric GPU "
            "memory: run the ranks with --device cuda, or leave window out on the CPU (POSIX "
            "shared memory windows)");
#ifndef AFD_WITH_CUDA
  AFD_CHECK(!cuda, "--device cuda: this build has no CUDA (nvcc was not found when it was built)");
#endif
#ifndef AFD_WITH_NCCL
  AFD_CHECK(!cuda || config.connector != kP2pNcclConnector,
            "afd.connector P2pNcclAFDConnector on --device cuda: this build has no NCCL (its "
            "header or library was not found when it was built); use AsyncAFDConnector");
  AFD_CHECK(!config.is_async() || config.async_options.window != "nccl",
            "afd.connector_extra_config.window \"nccl\": this build has no NCCL (its header or "
            "library was not found when it was built); use window \"cuda_ipc\"");
#endif
}

}  // namespace afd::deploy

#include "afd/deploy/transport.h"

#include "afd/common/error.h"
#include "afd/config/connector_options.h"

namespace afd::deploy {

void CheckConnectorImplemented(const AfdConfig& config) {
  AFD_CHECK(config.connector != kGpuAsyncConnector,
            "afd.connector {}: the asynchronous window connector on cuda (CUDA IPC windows) is "
            "not implemented in this build yet; its config is accepted by `afd config check` but "
            "cannot run. CPU processes on one host use AsyncAFDConnector (POSIX shared memory "
            "windows); P2pHostAFDConnector and P2pNcclAFDConnector run anywhere",
            config.connector);
}

}  // namespace afd::deploy

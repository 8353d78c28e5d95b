#include "afd/deploy/transport.h"

#include "afd/common/error.h"
#include "afd/config/connector_options.h"

namespace afd::deploy {

void CheckConnectorImplemented(const AfdConfig& config) {
  AFD_CHECK(config.connector != kGpuAsyncConnector,
            "afd.connector {}: the asynchronous window connector (seed 003) is not implemented "
            "in this build yet; its config is accepted by `afd config check` but cannot run. Use "
            "P2pHostAFDConnector or P2pNcclAFDConnector",
            config.connector);
}

}  // namespace afd::deploy

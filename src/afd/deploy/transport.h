// Which connector and transport a rank uses. The choice is made here, once, from the validated
// config: P2pHostAFDConnector and P2pNcclAFDConnector run the P2P hub/spoke connector (host
// rows over TCP; with --device cuda in `afd connector-test` the data plane goes over NCCL,
// device_context.h); AsyncAFDConnector runs the asynchronous window connector over POSIX shared
// memory (CPU processes of one host). A connector the config accepts but this build does not implement yet is
// refused at startup, never silently replaced.
#pragma once

#include "afd/config/afd_config.h"

namespace afd::deploy {

// Throws afd::Error naming the connector when it cannot run in this build.
void CheckConnectorImplemented(const AfdConfig& config);

}  // namespace afd::deploy

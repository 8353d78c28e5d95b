// Which connector and transport a rank uses. The choice is made here, once, from the validated
// config: P2pHostAFDConnector and P2pNcclAFDConnector run the P2P hub/spoke connector (host
// rows over TCP on CPU ranks; on GPU ranks P2pNcclAFDConnector's data plane goes over NCCL,
// device_context.h, one GPU per rank); AsyncAFDConnector runs the asynchronous window connector
// over POSIX shared memory (CPU processes of one host), and on cuda -- AsyncAFDConnector or
// GpuAsyncAFDConnector -- with the rows in CUDA IPC windows (GPU processes of one node, several
// may share a GPU) or NCCL symmetric-memory windows. A connector that cannot run as asked is
// refused at startup, never silently replaced.
#pragma once

#include "afd/config/afd_config.h"

namespace afd::deploy {

// Throws afd::Error naming the connector when it cannot run in this build or on this device
// (`cuda`: the rank's model runs on a GPU).
void CheckConnectorImplemented(const AfdConfig& config, bool cuda = false);

}  // namespace afd::deploy

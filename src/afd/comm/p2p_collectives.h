// Collectives written once over the point-to-point half of the Communicator interface: every
// rank exchanges with every other rank in one group, then combines locally in rank order (so
// results are bitwise identical on all ranks). Used by the host transports (TcpCommunicator,
// MemoryCommunicator).
#pragma once

#include <vector>

#include "afd/comm/communicator.h"

namespace afd::comm {

void P2pBarrier(Communicator& c);
void P2pAllReduce(Communicator& c, void* buf, size_t count, DType dtype, ReduceOp op);
void P2pAllToAllV(Communicator& c, const void* send, const std::vector<size_t>& send_counts,
                  void* recv, const std::vector<size_t>& recv_counts, DType dtype);

}  // namespace afd::comm

// The Communicator interface: what connectors need from a transport, and nothing more.
// Implementations: TcpCommunicator (host memory, TCP; CPU deployments and tests) and, in the CUDA
// build, NcclCommunicator (device memory). Connectors are written once against this interface.
//
// Semantics (those of NCCL point-to-point):
//  * Send/Recv of `count` elements of `dtype` to/from a group rank. A Recv must name the exact
//    count the matching Send carries; the host transport checks count, dtype and tag and throws
//    afd::Error naming the peer on any mismatch (NCCL cannot check and relies on the contract).
//  * Between GroupStart() and GroupEnd() operations are only queued; GroupEnd() runs them all
//    concurrently, so a hub can post all receives then all sends without deadlock. Outside a
//    group each operation runs alone and returns when done.
//  * Messages between one pair of ranks arrive in the order they were sent.
//  * Every wait is bounded by the communicator's timeout; on timeout, a closed connection or a
//    peer that died, afd::Error names the group, the peer (rank and role) and what was missing.
//
// Thread safety: one thread at a time per communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "afd/common/dtype.h"

namespace afd::comm {

enum class ReduceOp { kSum };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Group name and this rank's label, for messages ("afd_subgroup_1").
  virtual const std::string& name() const = 0;
  // "rank 2 (attention 1)": how errors name a member of this group.
  virtual std::string DescribeRank(int rank) const = 0;

  virtual void Send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) = 0;
  virtual void Recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) = 0;
  virtual void GroupStart() = 0;
  virtual void GroupEnd() = 0;

  // Waits up to timeout_s for the next message from `peer` to start arriving. Returns false when
  // none came (not an error: an idle peer); throws when the peer is gone.
  virtual bool WaitReadable(int peer, double timeout_s) = 0;

  virtual void Barrier() = 0;
  // Element-wise reduction over all ranks. Every rank sums the contributions in rank order, so
  // every rank gets bitwise the same result.
  virtual void AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // send holds send_counts[p] elements for each rank p in rank order; recv receives
  // recv_counts[p] elements from each rank p in rank order.
  virtual void AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                         const std::vector<size_t>& recv_counts, DType dtype) = 0;

  // Closes the connections so blocked peers fail fast instead of waiting for their timeout.
  // Safe to call more than once; the communicator is unusable afterwards.
  virtual void Shutdown() = 0;

  // Typed helpers.
  template <typename T>
  void Send(const T* buf, size_t count, int peer, uint32_t tag) {
    Send(buf, count, DTypeOf<T>(), peer, tag);
  }
  template <typename T>
  void Recv(T* buf, size_t count, int peer, uint32_t tag) {
    Recv(buf, count, DTypeOf<T>(), peer, tag);
  }
};

// Tags at or above this value are reserved for collectives.
inline constexpr uint32_t kReservedTagBase = 0xFFFF0000u;

}  // namespace afd::comm

// Communicator over TCP between host processes: a full mesh of connections inside one group.
//
// Creation (collective over the group's members): each member listens at its own address (the
// one that routes toward the rendezvous host), publishes "addr/<rank>" in the group's
// store, connects to every lower rank and accepts every higher one. So each group's transport is
// rooted at its first member's own address, never at the configured rendezvous host, and groups
// spread over several hosts come up. Every step is bounded by spec.timeout_s. A connection that
// does not prove spec.join_secret, or is not a member at all, is dropped with a log line.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afd/comm/communicator.h"
#include "afd/comm/socket.h"
#include "afd/comm/store.h"

namespace afd::comm {

struct GroupSpec {
  std::string name;  // group name, e.g. "afd_subgroup_0"
  int rank = 0;      // this process's rank in the group
  int size = 1;
  std::vector<std::string> labels;  // per group rank, e.g. "world rank 2 (attention 0)"
  std::string local_address;        // this process's address, reachable by the other members
  double timeout_s = 120;           // bound on every wait (creation and every operation)
  // The deployment's join secret: a connecting member proves it (wire.h, HelloProof), so an
  // outsider cannot take a member's place. nullopt in a deployment without one.
  std::optional<std::string> join_secret;
};

class TcpCommunicator : public Communicator {
 public:
  // `store` is the group's own key space (a PrefixStore). Throws afd::Error naming the members
  // that did not show up when the group cannot be formed in time.
  static std::unique_ptr<TcpCommunicator> Create(Store& store, const GroupSpec& spec);
  ~TcpCommunicator() override;

  int rank() const override { return spec_.rank; }
  int size() const override { return spec_.size; }
  const std::string& name() const override { return spec_.name; }
  std::string DescribeRank(int rank) const override;

  void Send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override;
  void Recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) override;
  void GroupStart() override;
  void GroupEnd() override;
  bool WaitReadable(int peer, double timeout_s) override;
  void Barrier() override;
  void AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                 const std::vector<size_t>& recv_counts, DType dtype) override;
  void Shutdown() override;

  // Exposed for the collective helpers; one per pending point-to-point operation.
  struct Op;

 private:
  explicit TcpCommunicator(GroupSpec spec);
  void Enqueue(bool is_send, void* buf, size_t count, DType dtype, int peer, uint32_t tag);
  // Progresses every queued op concurrently until done or timeout; a failure marks the group
  // unusable (broken_), since the byte streams are then out of step.
  void RunOps();
  void RunPendingOps();
  void CheckPeer(int peer) const;
  std::string Where(int peer) const;  // "rank 2 (attention 0) of group afd_subgroup_0"

  GroupSpec spec_;
  std::vector<Socket> peers_;  // indexed by group rank; invalid for self
  std::vector<uint64_t> send_seq_, recv_seq_;
  std::vector<Op> pending_;
  int group_depth_ = 0;
  bool shut_down_ = false;
  std::string broken_;  // why the group is unusable; empty while it is fine
};

}  // namespace afd::comm

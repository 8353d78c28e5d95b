// An in-memory Communicator for tests, with fault injection (LevelDB's fault-injecting Env in
// spirit): the members of one group are threads of one process sharing a MemoryFabric. Messages
// carry the host transport's MessageHeader and are checked the same way (wire.h), so a fault
// surfaces as the error a real transport would raise.
//
// A FaultPlan picks one message -- the at_message-th (0-based) sent by group rank `sender`,
// over all its peers -- and drops it (the receiver times out), delays it by delay_s (a
// stall; fatal when longer than the timeout), corrupts one byte of its header, or closes the
// sender's connections instead of sending it (the receiver sees the peer hang up).
//
// Thread safety: a MemoryCommunicator is used by one thread at a time; the fabric and the
// registry may be shared by any number of threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "afd/comm/communicator.h"
#include "afd/comm/tcp_communicator.h"
#include "afd/comm/wire.h"
#include "afd/common/thread_annotations.h"

namespace afd::comm {

struct FaultPlan {
  enum class Kind { kNone, kDrop, kDelay, kCorrupt, kClose };
  Kind kind = Kind::kNone;
  int sender = -1;          // group rank whose messages are counted; -1: every rank's
  uint64_t at_message = 0;  // which of them (0-based)
  double delay_s = 0;       // kDelay
  size_t corrupt_byte = 0;  // kCorrupt: the header byte (0..31) whose bits are inverted
};

std::string FaultName(FaultPlan::Kind kind);

class MemoryFabric {
 public:
  MemoryFabric(int size, FaultPlan plan = {});
  // Whether the plan's fault has been applied.
  bool fault_injected() const;

 private:
  friend class MemoryCommunicator;
  using Clock = std::chrono::steady_clock;
  struct Message {
    MessageHeader header;
    std::vector<char> payload;
    Clock::time_point deliver_at;
  };
  std::deque<Message>& Queue(int from, int to) AFD_REQUIRES(mu_) {
    return queues_[from * size_ + to];
  }

  const int size_;
  const FaultPlan plan_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  std::vector<std::deque<Message>> queues_ AFD_GUARDED_BY(mu_);  // [from * size + to]
  std::vector<bool> closed_ AFD_GUARDED_BY(mu_);                 // per rank
  std::vector<uint64_t> sent_ AFD_GUARDED_BY(mu_);               // messages sent per rank
  bool injected_ AFD_GUARDED_BY(mu_) = false;
};

class MemoryCommunicator : public Communicator {
 public:
  MemoryCommunicator(std::shared_ptr<MemoryFabric> fabric, GroupSpec spec);
  ~MemoryCommunicator() override;

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

 private:
  struct Op {
    bool is_send;
    int peer;
    char* buf;
    size_t bytes;
    DType dtype;
    uint32_t tag;
  };
  void Enqueue(const Op& op);
  void RunOps();  // sends first (they never block), then receives in order
  void SendNow(const Op& op);
  void RecvNow(const Op& op, const Deadline& deadline);
  void CheckUsable(int peer) const;
  std::string Where(int peer) const;

  std::shared_ptr<MemoryFabric> fabric_;
  GroupSpec spec_;
  std::vector<uint64_t> send_seq_, recv_seq_;
  std::vector<Op> pending_;
  int group_depth_ = 0;
  bool shut_down_ = false;
  std::string broken_;  // why the group is unusable; empty while it is fine
};

// Fabrics by group name, for a CommunicatorFactory shared by the threads of one test
// deployment: the first member of a group creates its fabric with the plan set for that name.
class MemoryFabricRegistry {
 public:
  void SetPlan(const std::string& group, FaultPlan plan);
  std::shared_ptr<MemoryFabric> Get(const std::string& group, int size);
  // Whether the plan of `group` has been applied.
  bool FaultInjected(const std::string& group);

 private:
  Mutex mu_;
  std::map<std::string, FaultPlan> plans_ AFD_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<MemoryFabric>> fabrics_ AFD_GUARDED_BY(mu_);
};

}  // namespace afd::comm

#include "afd/comm/memory_communicator.h"

#include <cstring>

#include "afd/comm/p2p_collectives.h"
#include "afd/common/error.h"

namespace afd::comm {

std::string FaultName(FaultPlan::Kind kind) {
  switch (kind) {
    case FaultPlan::Kind::kNone:
      return "none";
    case FaultPlan::Kind::kDrop:
      return "drop";
    case FaultPlan::Kind::kDelay:
      return "delay";
    case FaultPlan::Kind::kCorrupt:
      return "corrupt";
    case FaultPlan::Kind::kClose:
      return "close";
  }
  return "unknown";
}

MemoryFabric::MemoryFabric(int size, FaultPlan plan)
    : size_(size),
      plan_(plan),
      queues_(static_cast<size_t>(size) * size),
      closed_(size, false),
      sent_(size, 0) {}

bool MemoryFabric::fault_injected() const {
  MutexLock lock(mu_);
  return injected_;
}

MemoryCommunicator::MemoryCommunicator(std::shared_ptr<MemoryFabric> fabric, GroupSpec spec)
    : fabric_(std::move(fabric)),
      spec_(std::move(spec)),
      send_seq_(spec_.size, 0),
      recv_seq_(spec_.size, 0) {
  AFD_CHECK(fabric_->size_ == spec_.size && spec_.rank >= 0 && spec_.rank < spec_.size,
            "group {}: rank {} of {} does not fit a fabric of {} ranks", spec_.name, spec_.rank,
            spec_.size, fabric_->size_);
}

MemoryCommunicator::~MemoryCommunicator() { Shutdown(); }

std::string MemoryCommunicator::DescribeRank(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(spec_.labels.size())) {
    return fmt::format("rank {} ({})", rank, spec_.labels[rank]);
  }
  return fmt::format("rank {}", rank);
}

std::string MemoryCommunicator::Where(int peer) const {
  return fmt::format("{} of group {}", DescribeRank(peer), spec_.name);
}

void MemoryCommunicator::CheckUsable(int peer) const {
  AFD_CHECK(!shut_down_, "group {}: used after shutdown", spec_.name);
  AFD_CHECK(broken_.empty(), "group {}: group unusable after an earlier failed operation: {}",
            spec_.name, broken_);
  AFD_CHECK(peer >= 0 && peer < spec_.size && peer != spec_.rank,
            "group {}: peer {} is not another rank of the group (size {}, self {})", spec_.name,
            peer, spec_.size, spec_.rank);
}

void MemoryCommunicator::Enqueue(const Op& op) {
  CheckUsable(op.peer);
  pending_.push_back(op);
  if (group_depth_ == 0) RunOps();
}

void MemoryCommunicator::Send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  Enqueue({true, peer, static_cast<char*>(const_cast<void*>(buf)), count * DTypeSize(dtype), dtype,
           tag});
}

void MemoryCommunicator::Recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  Enqueue({false, peer, static_cast<char*>(buf), count * DTypeSize(dtype), dtype, tag});
}

void MemoryCommunicator::GroupStart() { ++group_depth_; }

void MemoryCommunicator::GroupEnd() {
  AFD_CHECK(group_depth_ > 0, "group {}: GroupEnd without GroupStart", spec_.name);
  if (--group_depth_ == 0) RunOps();
}

void MemoryCommunicator::RunOps() {
  std::vector<Op> ops;
  ops.swap(pending_);
  const Deadline deadline = Deadline::In(spec_.timeout_s);
  try {
    for (const Op& op : ops) {
      if (op.is_send) SendNow(op);
    }
    for (const Op& op : ops) {
      if (!op.is_send) RecvNow(op, deadline);
    }
  } catch (const Error& e) {
    broken_ = e.what();
    throw;
  }
}

void MemoryCommunicator::SendNow(const Op& op) {
  MemoryFabric& f = *fabric_;
  MemoryFabric::Message m;
  m.header = MessageHeader{
      kMessageMagic, kWireVersion,        static_cast<uint8_t>(op.dtype), 0, op.tag, 0,
      op.bytes,      send_seq_[op.peer]++};
  if (op.bytes > 0) m.payload.assign(op.buf, op.buf + op.bytes);
  m.deliver_at = MemoryFabric::Clock::now();
  MutexLock lock(f.mu_);
  AFD_CHECK(!f.closed_[op.peer], "lost connection to {} while sending: the peer hung up",
            Where(op.peer));
  const uint64_t n = f.sent_[spec_.rank]++;
  const FaultPlan& plan = f.plan_;
  if (plan.kind != FaultPlan::Kind::kNone && !f.injected_ &&
      (plan.sender < 0 || plan.sender == spec_.rank) && n == plan.at_message) {
    f.injected_ = true;
    switch (plan.kind) {
      case FaultPlan::Kind::kDrop:
        return;
      case FaultPlan::Kind::kDelay:
        m.deliver_at += std::chrono::duration_cast<MemoryFabric::Clock::duration>(
            std::chrono::duration<double>(plan.delay_s));
        break;
      case FaultPlan::Kind::kCorrupt:
        reinterpret_cast<uint8_t*>(&m.header)[plan.corrupt_byte % sizeof(MessageHeader)] ^= 0xFF;
        break;
      case FaultPlan::Kind::kClose:
        f.closed_[spec_.rank] = true;
        f.cv_.notify_all();
        AFD_THROW("lost connection to {} while sending: connection closed (injected fault)",
                  Where(op.peer));
      case FaultPlan::Kind::kNone:
        break;
    }
  }
  f.Queue(spec_.rank, op.peer).push_back(std::move(m));
  f.cv_.notify_all();
}

void MemoryCommunicator::RecvNow(const Op& op, const Deadline& deadline) {
  MemoryFabric& f = *fabric_;
  MutexLock lock(f.mu_);
  auto& queue = f.Queue(op.peer, spec_.rank);
  while (true) {
    AFD_CHECK(!f.closed_[spec_.rank], "group {}: {} was shut down while receiving", spec_.name,
              DescribeRank(spec_.rank));
    const auto now = MemoryFabric::Clock::now();
    if (!queue.empty() && queue.front().deliver_at <= now) break;
    AFD_CHECK(!(queue.empty() && f.closed_[op.peer]),
              "{} closed the connection (process exited or shut down)", Where(op.peer));
    if (deadline.expired()) {
      AFD_THROW(
          "group {}: {} timed out after {}s; still pending; receive of {} bytes (tag {:#x}) "
          "from {}",
          spec_.name, DescribeRank(spec_.rank), spec_.timeout_s, op.bytes, op.tag,
          DescribeRank(op.peer));
    }
    auto wake = MemoryFabric::Clock::now() + std::chrono::milliseconds(deadline.remaining_ms());
    if (!queue.empty()) wake = std::min(wake, queue.front().deliver_at);
    f.cv_.wait_until(lock, wake);
  }
  MemoryFabric::Message m = std::move(queue.front());
  queue.pop_front();
  lock.unlock();
  ValidateMessageHeader(m.header,
                        {recv_seq_[op.peer], op.tag, static_cast<uint8_t>(op.dtype), op.bytes},
                        Where(op.peer));
  ++recv_seq_[op.peer];
  if (op.bytes > 0) std::memcpy(op.buf, m.payload.data(), op.bytes);
}

bool MemoryCommunicator::WaitReadable(int peer, double timeout_s) {
  CheckUsable(peer);
  MemoryFabric& f = *fabric_;
  const Deadline deadline = Deadline::In(timeout_s);
  MutexLock lock(f.mu_);
  auto& queue = f.Queue(peer, spec_.rank);
  while (true) {
    if (!queue.empty() && queue.front().deliver_at <= MemoryFabric::Clock::now()) return true;
    AFD_CHECK(!(queue.empty() && f.closed_[peer]),
              "{} closed the connection (process exited or shut down)", Where(peer));
    if (deadline.expired()) return false;
    auto wake = MemoryFabric::Clock::now() + std::chrono::milliseconds(deadline.remaining_ms());
    if (!queue.empty()) wake = std::min(wake, queue.front().deliver_at);
    f.cv_.wait_until(lock, wake);
  }
}

void MemoryCommunicator::Barrier() { P2pBarrier(*this); }

void MemoryCommunicator::AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  P2pAllReduce(*this, buf, count, dtype, op);
}

void MemoryCommunicator::AllToAllV(const void* send, const std::vector<size_t>& send_counts,
                                   void* recv, const std::vector<size_t>& recv_counts,
                                   DType dtype) {
  P2pAllToAllV(*this, send, send_counts, recv, recv_counts, dtype);
}

void MemoryCommunicator::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  pending_.clear();
  MutexLock lock(fabric_->mu_);
  fabric_->closed_[spec_.rank] = true;
  fabric_->cv_.notify_all();
}

void MemoryFabricRegistry::SetPlan(const std::string& group, FaultPlan plan) {
  MutexLock lock(mu_);
  plans_[group] = plan;
}

std::shared_ptr<MemoryFabric> MemoryFabricRegistry::Get(const std::string& group, int size) {
  MutexLock lock(mu_);
  auto& fabric = fabrics_[group];
  if (!fabric) {
    auto plan = plans_.find(group);
    fabric =
        std::make_shared<MemoryFabric>(size, plan == plans_.end() ? FaultPlan{} : plan->second);
  }
  return fabric;
}

bool MemoryFabricRegistry::FaultInjected(const std::string& group) {
  std::shared_ptr<MemoryFabric> fabric;
  {
    MutexLock lock(mu_);
    auto it = fabrics_.find(group);
    if (it == fabrics_.end()) return false;
    fabric = it->second;
  }
  return fabric->fault_injected();
}

}  // namespace afd::comm

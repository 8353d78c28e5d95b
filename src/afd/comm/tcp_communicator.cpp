#include "afd/comm/tcp_communicator.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "afd/comm/wire.h"
#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::comm {

struct TcpCommunicator::Op {
  bool is_send;
  int peer;
  char* buf;
  size_t bytes;
  DType dtype;
  uint32_t tag;
  MessageHeader header;  // outgoing header (send) or the one being received (recv)
  size_t header_done = 0;
  size_t payload_done = 0;
  bool done() const { return header_done == sizeof(MessageHeader) && payload_done == bytes; }
};

TcpCommunicator::TcpCommunicator(GroupSpec spec)
    : spec_(std::move(spec)),
      peers_(spec_.size),
      send_seq_(spec_.size, 0),
      recv_seq_(spec_.size, 0) {}

TcpCommunicator::~TcpCommunicator() = default;

std::string TcpCommunicator::DescribeRank(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(spec_.labels.size())) {
    return fmt::format("rank {} ({})", rank, spec_.labels[rank]);
  }
  return fmt::format("rank {}", rank);
}

std::string TcpCommunicator::Where(int peer) const {
  return fmt::format("{} of group {}", DescribeRank(peer), spec_.name);
}

std::unique_ptr<TcpCommunicator> TcpCommunicator::Create(Store& store, const GroupSpec& spec) {
  AFD_CHECK(spec.size >= 1 && spec.rank >= 0 && spec.rank < spec.size,
            "group {}: rank {} is out of range for size {}", spec.name, spec.rank, spec.size);
  std::unique_ptr<TcpCommunicator> comm(new TcpCommunicator(spec));
  if (spec.size == 1) return comm;
  const Deadline deadline = Deadline::In(spec.timeout_s);
  const uint32_t group_hash = HashName(spec.name.c_str());

  Socket listener = Listen(spec.local_address, 0);
  comm->spec_.local_address = spec.local_address;
  store.Set(fmt::format("addr/{}", spec.rank),
            fmt::format("{}:{}", spec.local_address, LocalPort(listener)));

  // Connect to every lower rank.
  for (int peer = 0; peer < spec.rank; ++peer) {
    const std::string key = fmt::format("addr/{}", peer);
    std::string addr;
    try {
      addr = store.Get(key, std::max(0.001, deadline.remaining_ms() / 1000.0));
    } catch (const Error&) {
      AFD_THROW("group {}: {} never published its address within {}s", spec.name,
                comm->DescribeRank(peer), spec.timeout_s);
    }
    const size_t colon = addr.rfind(':');
    int port = -1;
    if (colon != std::string::npos) {
      const std::string digits = addr.substr(colon + 1);
      if (!digits.empty() && digits.size() <= 5 &&
          digits.find_first_not_of("0123456789") == std::string::npos) {
        port = std::stoi(digits);
      }
    }
    AFD_CHECK(port > 0 && port <= 65535, "group {}: {} published a malformed address \"{}\"",
              spec.name, comm->DescribeRank(peer), addr);
    Socket s = Connect(addr.substr(0, colon), port, deadline, comm->Where(peer));
    const HelloHeader hello{kHelloMagic, kWireVersion, 0, group_hash, spec.rank};
    s.SendAll(&hello, sizeof(hello), deadline, comm->Where(peer));
    std::string nonce(kHelloNonceBytes, '\0');
    s.RecvAll(nonce.data(), nonce.size(), deadline, comm->Where(peer));
    const std::string proof = HelloProof(spec.join_secret, spec.name, spec.rank, nonce);
    s.SendAll(proof.data(), proof.size(), deadline, comm->Where(peer));
    comm->peers_[peer] = std::move(s);
  }
  // Accept every higher rank. A connection that is not one (an outsider, a member of another
  // group, garbage, silence) is dropped with a log line and costs at most kHelloSeconds.
  constexpr double kHelloSeconds = 5.0;
  auto missing_members = [&] {
    std::string missing;
    for (int p = spec.rank + 1; p < spec.size; ++p) {
      if (!comm->peers_[p].valid())
        missing += (missing.empty() ? "" : ", ") + comm->DescribeRank(p);
    }
    return missing;
  };
  for (int n = spec.rank + 1; n < spec.size;) {
    Socket s;
    try {
      s = Accept(listener, deadline, "members");
    } catch (const Error&) {
      AFD_THROW("group {}: timed out after {}s waiting for {} to connect to {}", spec.name,
                spec.timeout_s, missing_members(), comm->DescribeRank(spec.rank));
    }
    HelloHeader hello{};
    try {
      const Deadline hello_deadline =
          Deadline::In(std::min(kHelloSeconds, deadline.remaining_ms() / 1000.0));
      s.RecvAll(&hello, sizeof(hello), hello_deadline, "a connecting member of group " + spec.name);
      ValidateHello(hello, group_hash, spec.rank + 1, spec.size);
      AFD_CHECK(!comm->peers_[hello.rank].valid(), "duplicate connection from rank {}", hello.rank);
      const std::string nonce = RandomBytes(kHelloNonceBytes);
      s.SendAll(nonce.data(), nonce.size(), hello_deadline, "a connecting member");
      std::string proof(kHelloNonceBytes, '\0');
      s.RecvAll(proof.data(), proof.size(), hello_deadline, "a connecting member");
      AFD_CHECK(DigestsEqual(proof, HelloProof(spec.join_secret, spec.name, hello.rank, nonce)),
                "the connection claiming rank {} did not prove the join secret (an outsider, or a "
                "process with another secret)",
                hello.rank);
    } catch (const Error& e) {
      std::fprintf(stderr, "afd: group %s: dropped a connection to %s: %s\n", spec.name.c_str(),
                   comm->DescribeRank(spec.rank).c_str(), e.what());
      continue;
    }
    comm->peers_[hello.rank] = std::move(s);
    ++n;
  }
  return comm;
}

void TcpCommunicator::CheckPeer(int peer) const {
  AFD_CHECK(!shut_down_, "group {}: used after shutdown", spec_.name);
  AFD_CHECK(broken_.empty(),
            "group {}: group unusable after an earlier failed operation (the byte streams are out "
            "of step): {}",
            spec_.name, broken_);
  AFD_CHECK(peer >= 0 && peer < spec_.size && peer != spec_.rank,
            "group {}: peer {} is not another rank of the group (size {}, self {})", spec_.name,
            peer, spec_.size, spec_.rank);
}

void TcpCommunicator::Enqueue(bool is_send, void* buf, size_t count, DType dtype, int peer,
                              uint32_t tag) {
  CheckPeer(peer);
  Op op{};
  op.is_send = is_send;
  op.peer = peer;
  op.buf = static_cast<char*>(buf);
  op.bytes = count * DTypeSize(dtype);
  op.dtype = dtype;
  op.tag = tag;
  if (is_send) {
    op.header =
        MessageHeader{kMessageMagic, kWireVersion,     static_cast<uint8_t>(dtype), 0, tag, 0,
                      op.bytes,      send_seq_[peer]++};
  }
  pending_.push_back(op);
  if (group_depth_ == 0) RunOps();
}

void TcpCommunicator::Send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  Enqueue(true, const_cast<void*>(buf), count, dtype, peer, tag);
}

void TcpCommunicator::Recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  Enqueue(false, buf, count, dtype, peer, tag);
}

void TcpCommunicator::GroupStart() { ++group_depth_; }

void TcpCommunicator::GroupEnd() {
  AFD_CHECK(group_depth_ > 0, "group {}: GroupEnd without GroupStart", spec_.name);
  if (--group_depth_ == 0) RunOps();
}

void TcpCommunicator::RunOps() {
  try {
    RunPendingOps();
  } catch (const Error& e) {
    // Some bytes of some messages may have moved: the streams are out of step for good.
    broken_ = e.what();
    throw;
  }
}

void TcpCommunicator::RunPendingOps() {
  std::vector<Op> ops;
  ops.swap(pending_);
  const Deadline deadline = Deadline::In(spec_.timeout_s);
  // Per peer, sends run in FIFO order and receives in FIFO order; both directions and all peers
  // progress together.
  const int n = spec_.size;
  std::vector<size_t> next_send(n, SIZE_MAX), next_recv(n, SIZE_MAX);
  auto advance = [&](std::vector<size_t>& next, int peer, bool is_send, size_t from) {
    next[peer] = SIZE_MAX;
    for (size_t i = from; i < ops.size(); ++i) {
      if (ops[i].peer == peer && ops[i].is_send == is_send && !ops[i].done()) {
        next[peer] = i;
        return;
      }
    }
  };
  for (int p = 0; p < n; ++p) {
    advance(next_send, p, true, 0);
    advance(next_recv, p, false, 0);
  }
  auto progress_send = [&](Op& op) -> bool {
    Socket& s = peers_[op.peer];
    size_t moved = 0;
    if (op.header_done < sizeof(MessageHeader)) {
      moved = s.SendSome(reinterpret_cast<char*>(&op.header) + op.header_done,
                         sizeof(MessageHeader) - op.header_done, Where(op.peer));
      op.header_done += moved;
      if (op.header_done < sizeof(MessageHeader)) return moved > 0;
    }
    if (op.payload_done < op.bytes) {
      const size_t m =
          s.SendSome(op.buf + op.payload_done, op.bytes - op.payload_done, Where(op.peer));
      op.payload_done += m;
      moved += m;
    }
    return moved > 0;
  };
  auto progress_recv = [&](Op& op) -> bool {
    Socket& s = peers_[op.peer];
    size_t moved = 0;
    if (op.header_done < sizeof(MessageHeader)) {
      moved = s.RecvSome(reinterpret_cast<char*>(&op.header) + op.header_done,
                         sizeof(MessageHeader) - op.header_done, Where(op.peer));
      op.header_done += moved;
      if (op.header_done < sizeof(MessageHeader)) return moved > 0;
      const MessageHeader& h = op.header;
      ValidateMessageHeader(h,
                            {recv_seq_[op.peer], op.tag, static_cast<uint8_t>(op.dtype), op.bytes},
                            Where(op.peer));
      ++recv_seq_[op.peer];
    }
    if (op.payload_done < op.bytes) {
      const size_t m =
          s.RecvSome(op.buf + op.payload_done, op.bytes - op.payload_done, Where(op.peer));
      op.payload_done += m;
      moved += m;
    }
    return moved > 0;
  };

  auto throw_timeout = [&]() {
    std::string missing;
    for (int p = 0; p < n; ++p) {
      if (next_recv[p] != SIZE_MAX) {
        const Op& op = ops[next_recv[p]];
        missing += fmt::format("; receive of {} bytes (tag {:#x}) from {}, {} bytes in", op.bytes,
                               op.tag, DescribeRank(p), op.payload_done + op.header_done);
      }
      if (next_send[p] != SIZE_MAX) {
        const Op& op = ops[next_send[p]];
        missing += fmt::format("; send of {} bytes (tag {:#x}) to {}, {} bytes out", op.bytes,
                               op.tag, DescribeRank(p), op.payload_done);
      }
    }
    AFD_THROW("group {}: {} timed out after {}s; still pending{}", spec_.name,
              DescribeRank(spec_.rank), spec_.timeout_s, missing);
  };

  while (true) {
    bool all_done = true, progressed = false;
    for (int p = 0; p < n; ++p) {
      if (next_send[p] != SIZE_MAX) {
        Op& op = ops[next_send[p]];
        progressed |= progress_send(op);
        if (op.done()) {
          advance(next_send, p, true, next_send[p] + 1);
          progressed = true;
        }
      }
      if (next_recv[p] != SIZE_MAX) {
        Op& op = ops[next_recv[p]];
        progressed |= progress_recv(op);
        if (op.done()) {
          advance(next_recv, p, false, next_recv[p] + 1);
          progressed = true;
        }
      }
      all_done &= next_send[p] == SIZE_MAX && next_recv[p] == SIZE_MAX;
    }
    if (all_done) return;
    // Checked on every pass, not only when poll times out: a peer that trickles bytes keeps
    // poll busy but cannot outlive the deadline.
    if (deadline.expired()) throw_timeout();
    if (progressed) continue;
    std::vector<pollfd> fds;
    for (int p = 0; p < n; ++p) {
      short events = 0;
      if (next_send[p] != SIZE_MAX) events |= POLLOUT;
      if (next_recv[p] != SIZE_MAX) events |= POLLIN;
      if (events) fds.push_back({peers_[p].fd(), events, 0});
    }
    const int rc = poll(fds.data(), fds.size(), deadline.remaining_ms());
    if (rc < 0 && errno != EINTR) {
      AFD_THROW("group {}: poll failed on {}: {}", spec_.name, DescribeRank(spec_.rank),
                std::strerror(errno));
    }
    if (rc == 0) throw_timeout();
  }
}

bool TcpCommunicator::WaitReadable(int peer, double timeout_s) {
  CheckPeer(peer);
  pollfd p{peers_[peer].fd(), POLLIN, 0};
  const int rc = poll(&p, 1, Deadline::In(timeout_s).remaining_ms());
  if (rc <= 0) return false;
  char c;
  const ssize_t n = ::recv(peers_[peer].fd(), &c, 1, MSG_PEEK);
  if (n == 0) AFD_THROW("{} closed the connection (process exited or shut down)", Where(peer));
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    AFD_THROW("lost connection to {}: {}", Where(peer), std::strerror(errno));
  }
  return n > 0;
}

void TcpCommunicator::Shutdown() {
  shut_down_ = true;
  pending_.clear();
  for (auto& s : peers_) {
    if (s.valid()) ::shutdown(s.fd(), SHUT_RDWR);
    s.Close();
  }
}

}  // namespace afd::comm

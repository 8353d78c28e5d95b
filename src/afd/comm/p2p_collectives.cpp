// Collectives over point-to-point groups (p2p_collectives.h).
#include "afd/comm/p2p_collectives.h"

#include <cstring>

#include "afd/comm/tcp_communicator.h"
#include "afd/common/error.h"

namespace afd::comm {

namespace {
constexpr uint32_t kBarrierTag = kReservedTagBase + 1;
constexpr uint32_t kAllReduceTag = kReservedTagBase + 2;
constexpr uint32_t kAllToAllTag = kReservedTagBase + 3;
}  // namespace

void P2pBarrier(Communicator& c) {
  c.GroupStart();
  for (int p = 0; p < c.size(); ++p) {
    if (p == c.rank()) continue;
    c.Send(nullptr, 0, DType::kU8, p, kBarrierTag);
    c.Recv(nullptr, 0, DType::kU8, p, kBarrierTag);
  }
  c.GroupEnd();
}

void P2pAllReduce(Communicator& c, void* buf, size_t count, DType dtype, ReduceOp op) {
  AFD_CHECK(op == ReduceOp::kSum, "group {}: only sum all-reduce is supported", c.name());
  AFD_CHECK(dtype == DType::kF32 || dtype == DType::kI64,
            "group {}: all-reduce supports float32 and int64, not {}", c.name(), DTypeName(dtype));
  if (c.size() == 1) return;
  const size_t bytes = count * DTypeSize(dtype);
  // Gather every rank's contribution, then sum in rank order on every rank.
  std::vector<char> all(bytes * c.size());
  if (bytes > 0) std::memcpy(all.data() + bytes * c.rank(), buf, bytes);
  c.GroupStart();
  for (int p = 0; p < c.size(); ++p) {
    if (p == c.rank()) continue;
    c.Recv(all.data() + bytes * p, count, dtype, p, kAllReduceTag);
    c.Send(buf, count, dtype, p, kAllReduceTag);
  }
  c.GroupEnd();
  if (dtype == DType::kF32) {
    float* out = static_cast<float*>(buf);
    const float* in = reinterpret_cast<const float*>(all.data());
    for (size_t i = 0; i < count; ++i) {
      float s = in[i];
      for (int p = 1; p < c.size(); ++p) s += in[p * count + i];
      out[i] = s;
    }
  } else {
    int64_t* out = static_cast<int64_t*>(buf);
    const int64_t* in = reinterpret_cast<const int64_t*>(all.data());
    for (size_t i = 0; i < count; ++i) {
      int64_t s = in[i];
      for (int p = 1; p < c.size(); ++p) s += in[p * count + i];
      out[i] = s;
    }
  }
}

void P2pAllToAllV(Communicator& c, const void* send, const std::vector<size_t>& send_counts,
                  void* recv, const std::vector<size_t>& recv_counts, DType dtype) {
  const int n = c.size();
  AFD_CHECK(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
            "group {}: all-to-all needs {} send and receive counts, got {} and {}", c.name(), n,
            send_counts.size(), recv_counts.size());
  AFD_CHECK(send_counts[c.rank()] == recv_counts[c.rank()],
            "group {}: all-to-all sends {} elements to itself but expects {}", c.name(),
            send_counts[c.rank()], recv_counts[c.rank()]);
  const size_t es = DTypeSize(dtype);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  size_t send_off = 0, recv_off = 0;
  c.GroupStart();
  for (int p = 0; p < n; ++p) {
    if (p == c.rank()) {
      if (send_counts[p] > 0) {  // empty buffers may be null: memcpy must not see them
        std::memcpy(r + recv_off * es, s + send_off * es, send_counts[p] * es);
      }
    } else {
      c.Recv(r + recv_off * es, recv_counts[p], dtype, p, kAllToAllTag);
      c.Send(s + send_off * es, send_counts[p], dtype, p, kAllToAllTag);
    }
    send_off += send_counts[p];
    recv_off += recv_counts[p];
  }
  c.GroupEnd();
}

void TcpCommunicator::Barrier() { P2pBarrier(*this); }
void TcpCommunicator::AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  P2pAllReduce(*this, buf, count, dtype, op);
}
void TcpCommunicator::AllToAllV(const void* send, const std::vector<size_t>& send_counts,
                                void* recv, const std::vector<size_t>& recv_counts, DType dtype) {
  P2pAllToAllV(*this, send, send_counts, recv, recv_counts, dtype);
}

}  // namespace afd::comm

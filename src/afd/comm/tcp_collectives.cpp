// Collectives of TcpCommunicator, built from its point-to-point groups: every rank exchanges
// with every other rank in one group, then combines locally in rank order (so results are
// bitwise identical on all ranks).
#include <cstring>

#include "afd/comm/tcp_communicator.h"
#include "afd/common/error.h"

namespace afd::comm {

namespace {
constexpr uint32_t kBarrierTag = kReservedTagBase + 1;
constexpr uint32_t kAllReduceTag = kReservedTagBase + 2;
constexpr uint32_t kAllToAllTag = kReservedTagBase + 3;
}  // namespace

void TcpCommunicator::Barrier() {
  GroupStart();
  for (int p = 0; p < spec_.size; ++p) {
    if (p == spec_.rank) continue;
    Enqueue(true, nullptr, 0, DType::kU8, p, kBarrierTag);
    Enqueue(false, nullptr, 0, DType::kU8, p, kBarrierTag);
  }
  GroupEnd();
}

void TcpCommunicator::AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  AFD_CHECK(op == ReduceOp::kSum, "group {}: only sum all-reduce is supported", spec_.name);
  AFD_CHECK(dtype == DType::kF32 || dtype == DType::kI64,
            "group {}: all-reduce supports float32 and int64, not {}", spec_.name,
            DTypeName(dtype));
  if (spec_.size == 1) return;
  const size_t bytes = count * DTypeSize(dtype);
  // Gather every rank's contribution, then sum in rank order on every rank.
  std::vector<char> all(bytes * spec_.size);
  if (bytes > 0) std::memcpy(all.data() + bytes * spec_.rank, buf, bytes);
  GroupStart();
  for (int p = 0; p < spec_.size; ++p) {
    if (p == spec_.rank) continue;
    Enqueue(false, all.data() + bytes * p, count, dtype, p, kAllReduceTag);
    Enqueue(true, buf, count, dtype, p, kAllReduceTag);
  }
  GroupEnd();
  if (dtype == DType::kF32) {
    float* out = static_cast<float*>(buf);
    const float* in = reinterpret_cast<const float*>(all.data());
    for (size_t i = 0; i < count; ++i) {
      float s = in[i];
      for (int p = 1; p < spec_.size; ++p) s += in[p * count + i];
      out[i] = s;
    }
  } else {
    int64_t* out = static_cast<int64_t*>(buf);
    const int64_t* in = reinterpret_cast<const int64_t*>(all.data());
    for (size_t i = 0; i < count; ++i) {
      int64_t s = in[i];
      for (int p = 1; p < spec_.size; ++p) s += in[p * count + i];
      out[i] = s;
    }
  }
}

void TcpCommunicator::AllToAllV(const void* send, const std::vector<size_t>& send_counts,
                                void* recv, const std::vector<size_t>& recv_counts, DType dtype) {
  const int n = spec_.size;
  AFD_CHECK(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
            "group {}: all-to-all needs {} send and receive counts, got {} and {}", spec_.name, n,
            send_counts.size(), recv_counts.size());
  AFD_CHECK(send_counts[spec_.rank] == recv_counts[spec_.rank],
            "group {}: all-to-all sends {} elements to itself but expects {}", spec_.name,
            send_counts[spec_.rank], recv_counts[spec_.rank]);
  const size_t es = DTypeSize(dtype);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  size_t send_off = 0, recv_off = 0;
  GroupStart();
  for (int p = 0; p < n; ++p) {
    if (p == spec_.rank) {
      if (send_counts[p] > 0) {  // empty buffers may be null: memcpy must not see them
        std::memcpy(r + recv_off * es, s + send_off * es, send_counts[p] * es);
      }
    } else {
      Enqueue(false, r + recv_off * es, recv_counts[p], dtype, p, kAllToAllTag);
      Enqueue(true, const_cast<char*>(s + send_off * es), send_counts[p], dtype, p, kAllToAllTag);
    }
    send_off += send_counts[p];
    recv_off += recv_counts[p];
  }
  GroupEnd();
}

}  // namespace afd::comm

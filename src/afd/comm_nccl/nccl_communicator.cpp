#include "afd/comm_nccl/nccl_communicator.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>

#include "afd/comm/nccl_plan.h"
#include "afd/common/env_switches.h"
#include "afd/common/error.h"

namespace afd::comm_nccl {

using comm::CheckNcclUniqueId;
using comm::FindSharedGpu;
using comm::GroupSpec;
using comm::kNcclUniqueIdBytes;
using comm::NcclCommIndexForTag;
using comm::NcclLibraryMismatch;
using comm::NcclUniqueIdKey;
using comm::NcclVersionText;
using comm::ReduceOp;
using comm::Store;

static_assert(NCCL_UNIQUE_ID_BYTES == kNcclUniqueIdBytes, "ncclUniqueId size changed");

namespace {

#define AFD_CUDA_CHECK(call)                                                              \
  do {                                                                                    \
    const cudaError_t err_ = (call);                                                      \
    AFD_CHECK(err_ == cudaSuccess, "{} failed: {} ({})", #call, cudaGetErrorString(err_), \
              cudaGetErrorName(err_));                                                    \
  } while (0)

ncclDataType_t ToNccl(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
    case DType::kF8E4M3:  // moved as bytes (no reduction of FP8 values is asked for)
      return ncclUint8;
  }
  AFD_THROW("dtype {} has no NCCL type", static_cast<int>(t));
}

}  // namespace

std::string GpuIdentity(int device) {
  char bus[64] = {0};
  AFD_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return fmt::format("{}/{}", host, bus);
}

std::vector<ncclComm_t> InitNcclComms(const std::vector<ncclUniqueId>& ids, int size, int rank,
                                      int device, double timeout_s, const std::string& what) {
  // ncclCommInitRank blocks until every rank joins; bound it. The init runs on its own thread
  // with state it shares, so a timed-out init can be left behind without touching freed memory.
  struct InitState {
    std::vector<ncclComm_t> comms;
    std::promise<ncclResult_t> done;
  };
  auto state = std::make_shared<InitState>();
  state->comms.assign(ids.size(), nullptr);
  std::future<ncclResult_t> done = state->done.get_future();
  std::thread([state, ids, size, rank, device]() {
    cudaSetDevice(device);
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; i < ids.size() && r == ncclSuccess; ++i) {
      r = ncclCommInitRank(&state->comms[i], size, ids[i], rank);
    }
    const ncclResult_t end = ncclGroupEnd();
    state->done.set_value(r != ncclSuccess ? r : end);
  }).detach();
  if (done.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) {
    AFD_THROW(
        "{}: NCCL communicator creation did not finish within {}s (a rank that never "
        "joined?)",
        what, timeout_s);
  }
  const ncclResult_t r = done.get();
  AFD_CHECK(r == ncclSuccess || r == ncclInProgress, "{}: ncclCommInitRank failed: {} ({})", what,
            ncclGetErrorString(r), ncclGetLastError(nullptr));
  return state->comms;
}

void SynchronizeStream(cudaStream_t stream, double timeout_s, const std::string& what) {
  // Polls: yielding for the first 2 ms (a layer's exchange ends within microseconds; a 50 us
  // sleep per poll put ~100 us on every round trip), then sleeping 50 us between polls.
  const Deadline deadline = Deadline::In(timeout_s);
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    AFD_CHECK(e == cudaErrorNotReady, "{}: the CUDA stream failed: {}", what,
              cudaGetErrorString(e));
    AFD_CHECK(!deadline.expired(),
              "{}: timed out after {}s waiting for the CUDA stream (a peer "
              "that never posted its side?)",
              what, timeout_s);
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

std::string NcclCommunicator::DescribeRank(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(spec_.labels.size())) {
    return fmt::format("rank {} ({})", rank, spec_.labels[rank]);
  }
  return fmt::format("rank {}", rank);
}

void NcclCommunicator::Check(ncclResult_t r, const char* call) const {
  if (r == ncclSuccess || r == ncclInProgress) return;
  AFD_THROW("group {}: {} failed on {}: {} ({})", spec_.name, call, DescribeRank(spec_.rank),
            ncclGetErrorString(r), ncclGetLastError(nullptr));
}

void CheckNcclRankSetup(Store& store, int rank, int size, const std::vector<std::string>& labels,
                        int device, double timeout_s, const std::string& group) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const std::string who =
      rank < static_cast<int>(labels.size()) ? labels[rank] : fmt::format("rank {}", rank);
  int loaded = 0;
  AFD_CHECK(ncclGetVersion(&loaded) == ncclSuccess, "{}, {}: ncclGetVersion failed", group, who);
  if (auto mismatch = NcclLibraryMismatch(NCCL_VERSION_CODE, loaded)) {
    AFD_THROW("{}, {}: {}", group, who, *mismatch);
  }
  AFD_CUDA_CHECK(cudaSetDevice(device));
  // Refuse two ranks on one GPU ourselves, naming them, before NCCL fails less clearly.
  store.Set(fmt::format("gpu/{}", rank), GpuIdentity(device));
  std::vector<std::string> keys, gpus;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("gpu/{}", r));
  store.Wait(keys, timeout_s);
  for (const auto& k : keys) gpus.push_back(store.TryGet(k).value_or(""));
  // AFD_NCCL_SKIP_SHARED_GPU_CHECK=1 lets NCCL itself meet the shared GPU (to see how its
  // refusal is reported); nothing else reads it.
  const bool skip = EnvValue("AFD_NCCL_SKIP_SHARED_GPU_CHECK") == "1";
  if (auto shared = FindSharedGpu(gpus, labels, group); shared && !skip) {
    AFD_THROW("{}", *shared);
  }
}

ncclUniqueId ShareNcclUniqueId(Store& store, int index, int rank, double timeout_s,
                               const std::string& group) {
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    AFD_CHECK(r == ncclSuccess, "{}: ncclGetUniqueId failed: {}", group, ncclGetErrorString(r));
    store.Set(NcclUniqueIdKey(index), std::string(id.internal, NCCL_UNIQUE_ID_BYTES));
  }
  const std::string bytes = store.Get(NcclUniqueIdKey(index), timeout_s);
  CheckNcclUniqueId(bytes, group);
  std::copy(bytes.begin(), bytes.end(), id.internal);
  return id;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::Create(Store& store, const GroupSpec& spec,
                                                           int device, cudaStream_t stream) {
  CheckNcclRankSetup(store, spec.rank, spec.size, spec.labels, device, spec.timeout_s,
                     fmt::format("group {}", spec.name));
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(spec));
  c->device_ = device;
  c->stream_ = stream;
  const std::vector<ncclUniqueId> ids = {
      ShareNcclUniqueId(store, 0, spec.rank, spec.timeout_s, spec.name),
      ShareNcclUniqueId(store, 1, spec.rank, spec.timeout_s, spec.name)};
  const std::vector<ncclComm_t> comms =
      InitNcclComms(ids, spec.size, spec.rank, device, spec.timeout_s,
                    fmt::format("group {} on {}", spec.name, c->DescribeRank(spec.rank)));
  c->comms_[0] = comms[0];
  c->comms_[1] = comms[1];
  AFD_CUDA_CHECK(cudaMalloc(&c->scratch_, sizeof(float)));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  for (ncclComm_t& comm : comms_) {
    if (comm) ncclCommAbort(comm);  // never blocks on peers that are gone
    comm = nullptr;
  }
  if (scratch_) cudaFree(scratch_);
}

void NcclCommunicator::CheckDeviceBuffer(const void* buf, size_t count, int peer,
                                         const char* what) const {
  AFD_CHECK(!shut_down_, "group {}: used after shutdown", spec_.name);
  AFD_CHECK(peer >= 0 && peer < spec_.size && peer != spec_.rank,
            "group {}: peer {} is not another rank of the group", spec_.name, peer);
  if (count == 0) return;
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, buf);
  AFD_CHECK(
      e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged),
      "group {}: the buffer of the {} {} {} is host memory; the NCCL communicator takes "
      "device buffers only",
      spec_.name, what, std::string(what) == "send" ? "to" : "from", DescribeRank(peer));
}

void NcclCommunicator::Send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  CheckDeviceBuffer(buf, count, peer, "send");
  Check(ncclSend(buf, count, ToNccl(dtype), peer, comms_[NcclCommIndexForTag(tag)], stream_),
        "ncclSend");
}

void NcclCommunicator::Recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
  CheckDeviceBuffer(buf, count, peer, "receive");
  Check(ncclRecv(buf, count, ToNccl(dtype), peer, comms_[NcclCommIndexForTag(tag)], stream_),
        "ncclRecv");
}

void NcclCommunicator::GroupStart() { Check(ncclGroupStart(), "ncclGroupStart"); }
void NcclCommunicator::GroupEnd() { Check(ncclGroupEnd(), "ncclGroupEnd"); }

bool NcclCommunicator::WaitReadable(int, double) {
  AFD_THROW(
      "group {}: the NCCL communicator cannot poll for messages; the control plane runs "
      "over the host transport",
      spec_.name);
}

void NcclCommunicator::Synchronize() {
  try {
    SynchronizeStream(stream_, spec_.timeout_s, "group " + spec_.name);
  } catch (const Error&) {
    Shutdown();
    throw;
  }
}

void NcclCommunicator::Barrier() {
  AllReduce(scratch_, 1, DType::kF32, ReduceOp::kSum);
  Synchronize();
}

void NcclCommunicator::AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  AFD_CHECK(op == ReduceOp::kSum, "group {}: only sum all-reduce is supported", spec_.name);
  Check(ncclAllReduce(buf, buf, count, ToNccl(dtype), ncclSum, comms_[0], stream_),
        "ncclAllReduce");
}

void NcclCommunicator::AllToAllV(const void* send, const std::vector<size_t>& send_counts,
                                 void* recv, const std::vector<size_t>& recv_counts, DType dtype) {
  const int n = spec_.size;
  AFD_CHECK(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
            "group {}: all-to-all needs {} counts", spec_.name, n);
  AFD_CHECK(send_counts[spec_.rank] == recv_counts[spec_.rank],
            "group {}: all-to-all sends {} elements to itself but expects {}", spec_.name,
            send_counts[spec_.rank], recv_counts[spec_.rank]);
  const size_t es = DTypeSize(dtype);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  size_t so = 0, ro = 0;
  // Closes the NCCL group even when an enqueue throws, so later calls do not land in it.
  struct GroupGuard {
    NcclCommunicator* c;
    bool open = true;
    ~GroupGuard() {
      if (open) ncclGroupEnd();
    }
  } guard{this};
  GroupStart();
  for (int p = 0; p < n; ++p) {
    if (p == spec_.rank) {
      AFD_CUDA_CHECK(cudaMemcpyAsync(r + ro * es, s + so * es, send_counts[p] * es,
                                     cudaMemcpyDeviceToDevice, stream_));
    } else {
      Check(ncclRecv(r + ro * es, recv_counts[p], ToNccl(dtype), p, comms_[0], stream_),
            "ncclRecv");
      Check(ncclSend(s + so * es, send_counts[p], ToNccl(dtype), p, comms_[0], stream_),
            "ncclSend");
    }
    so += send_counts[p];
    ro += recv_counts[p];
  }
  guard.open = false;
  GroupEnd();
}

void NcclCommunicator::Shutdown() {
  shut_down_ = true;
  for (ncclComm_t& comm : comms_) {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
}

std::string DescribeNcclVersions() {
  int loaded = 0;
  const std::string runtime =
      ncclGetVersion(&loaded) == ncclSuccess ? NcclVersionText(loaded) : std::string("unknown");
  return fmt::format("NCCL {} (built), {} (loaded)", NcclVersionText(NCCL_VERSION_CODE), runtime);
}

}  // namespace afd::comm_nccl

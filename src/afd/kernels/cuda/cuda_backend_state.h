// The CUDA backend's state as its two halves share it: cuda_backend.cpp (streams, memory,
// copies, graphs, profiles: the state itself) and cuda_backend_ops.cpp (each op's checks and
// launch). Internal to those two files; the scratch slots and CheckOn keep internal linkage.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "afd/common/cuda_check.h"
#include "afd/common/error.h"
#include "afd/kernels/cuda/cuda_backend.h"
#include "afd/kernels/op_checks.h"

namespace afd::kernels::cuda {

struct CudaBackend::State {
  // The stream ops go to: main, or side inside Beside (lane 1).
  cudaStream_t stream = nullptr;
  cudaStream_t main = nullptr, side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  int lane = 0;
  bool side_open = false;  // side work not yet joined
  cublasHandle_t cublas = nullptr;
  std::vector<std::shared_ptr<void>> scratch;  // by lane * kNumSlots + slot
  std::vector<size_t> scratch_bytes;
  // Expert pointer tables by (first tensor's address, kind), with the pointers they hold: a
  // table is reused only for the very same tensors (freed memory can come back at the same
  // address with other experts around it).
  struct ExpertTable {
    std::vector<const void*> ptrs;
    std::shared_ptr<void> device;
  };
  std::map<std::pair<const void*, int>, ExpertTable> expert_tables;
  // Scratch buffers replaced by larger ones: kept while the backend lives, since a captured
  // graph may still point at them.
  std::vector<std::shared_ptr<void>> retired;
  std::shared_ptr<void> cublas_workspace[2];  // by lane, set explicitly: capture never allocates
  // CopyToDevice's (and Sample's parameters') pinned staging ring. Positions count bytes since
  // the start: head, the next byte to stage; tail, the first whose copy may still be pending
  // (every copy staged before a completed wait is done: Synchronize, FinishCopyToHost).
  void* staging = nullptr;
  uint64_t staging_head = 0, staging_tail = 0;
  // StartCopyToHost's copies, by slot (Backend::OpenCopyTicket): pinned memory, its event, and
  // the staging head when the copy was enqueued.
  struct HostCopy {
    void* pinned = nullptr;
    size_t capacity = 0, bytes = 0;
    cudaEvent_t done = nullptr;
    uint64_t staged = 0;
  };
  HostCopy host_copies[Backend::kMaxCopiesToHost];
  // Other processes' allocations opened by CopyFromIpc, by handle: base, size and the use count
  // when last copied from. At most kMaxIpcMaps stay open (a restarted producer's old cache is
  // closed once newer ones push it out: an open mapping keeps a dead process's memory).
  struct IpcMap {
    char* base = nullptr;
    size_t size = 0;
    uint64_t last_use = 0;
  };
  static constexpr size_t kMaxIpcMaps = 8;
  std::map<std::string, IpcMap> ipc_maps;
  uint64_t ipc_uses = 0;
  bool capturing = false;
  int sm_count = 1;  // the device's multiprocessors (kernels size their grids by it)
  // WatchWaits: 0 = block in cudaStreamSynchronize; else poll, bounded, calling wait_check.
  double wait_timeout_s = 0;
  std::function<void()> wait_check;
  // Profiling: op names with the index of their start event (the end event follows it).
  bool profiling = false;
  bool profiler_range = false;  // cudaProfilerStart in effect (SetProfiling)
  std::vector<cudaEvent_t> events;
  size_t events_used = 0;
  std::vector<std::pair<std::string, size_t>> records;
  // Timed spans: (begin, end) event pairs, reused; spans_used pairs recorded since the last take.
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> spans;
  size_t spans_used = 0;
};

class CudaBackend::OpScope {
 public:
  // Times the ops enqueued in this scope under `op` (plus the dims, when given).
  OpScope(CudaBackend& b, const char* op, std::initializer_list<int64_t> dims = {})
      : state_(*b.state_) {
    if (!state_.profiling || state_.capturing) return;
    std::string name = op;
    for (size_t i = 0; i < dims.size(); ++i) {
      name += fmt::format("{}{}", i == 0 ? " " : "x", dims.begin()[i]);
    }
    start_ = NextEvent();
    NextEvent();
    AFD_CUDA_CHECK(cudaEventRecord(state_.events[start_], state_.stream));
    state_.records.emplace_back(std::move(name), start_);
    active_ = true;
  }
  ~OpScope() {
    if (active_) cudaEventRecord(state_.events[start_ + 1], state_.stream);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  size_t NextEvent() {
    if (state_.events_used == state_.events.size()) {
      cudaEvent_t e;
      AFD_CUDA_CHECK(cudaEventCreate(&e));
      state_.events.push_back(e);
    }
    return state_.events_used++;
  }
  State& state_;
  size_t start_ = 0;
  bool active_ = false;
};

namespace {

// Scratch buffers by purpose: CudaBackend::Scratch(lane * kNumSlots + slot, bytes).
enum ScratchSlot {
  kBf16Input,
  kSortKeys,
  kSortVals,
  kSortTemp,
  kSampleParams,
  kMoeAct,
  kMlaPartial,
  kMlaCounters,         // zeroed when allocated
  kRouterCounter,       // likewise
  kRouterRowsCounters,  // likewise
  kMlaLatent,
  kMlaPrefillCtx,  // MlaPrefill: gathered cache rows, kv_b as bf16, decompressed k_nope | v
  kMlaPrefillKvb,
  kMlaPrefillKv,
  kPermuteCounts,  // MoePermute over many slots: per-block expert counts
  kSampleReduce,
  kGqaPartial,
  kFp8Experts,  // FP8 experts dequantized for the tiled form (prefill sizes)
  kNumSlots
};

inline void CheckOn(const char* op, const Tensor& t, int device) {
  CheckOnDevice(op, t, Device::Cuda(device));
}

}  // namespace

}  // namespace afd::kernels::cuda

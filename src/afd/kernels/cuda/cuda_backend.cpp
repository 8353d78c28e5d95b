#include "afd/kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "afd/common/cuda_check.h"
#include "afd/common/env_switches.h"
#include "afd/common/error.h"
#include "afd/kernels/cuda/afd.cuh"
#include "afd/kernels/cuda/elementwise.cuh"
#include "afd/kernels/cuda/gemv.cuh"
#include "afd/kernels/cuda/gqa.cuh"
#include "afd/kernels/cuda/kernel_trace.h"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/moe.cuh"
#include "afd/kernels/cuda/router.cuh"
#include "afd/kernels/cuda/sample.cuh"
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

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
  kNumSlots
};

constexpr size_t kStagingBytes = size_t{16} << 20;
constexpr size_t kCublasWorkspaceBytes = size_t{64} << 20;
// Beside with more rows runs in place (prefill: its GEMMs fill the GPU alone).
constexpr int64_t kBesideMaxRows = 1024;

// A captured CUDA graph, replayed on the backend's stream.
class CudaGraph : public OpGraph {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream)
      : graph_(graph), exec_(exec), stream_(stream) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void Replay() override { AFD_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

void CheckOn(const char* op, const Tensor& t, int device) {
  CheckOnDevice(op, t, Device::Cuda(device));
}

PagedArgs Paged(const AttentionTokens& t) {
  return {t.positions.data_as<const int64_t>(),
          t.seq_index.data_as<const int32_t>(),
          t.slot_mapping.data_as<const int64_t>(),
          t.block_tables.data_as<const int32_t>(),
          t.block_tables.dim(1),
          t.block_size};
}

RopeArgs Rope(const RopeSpec& r) {
  return {r.inv_freq.data_as<const float>(), 2 * r.inv_freq.numel(), r.attention_factor,
          r.interleave};
}

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device), state_(std::make_unique<State>()) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  AFD_CHECK(e == cudaSuccess && count > 0, "cuda:{}: no usable CUDA device ({})", device,
            e == cudaSuccess ? "none found" : cudaGetErrorString(e));
  AFD_CHECK(device >= 0 && device < count, "cuda:{}: this machine has {} CUDA device(s)", device,
            count);
  AFD_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  AFD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  name_ = fmt::format("cuda:{} ({})", device, prop.name);
  state_->sm_count = prop.multiProcessorCount;
  AFD_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->main, cudaStreamNonBlocking));
  AFD_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->side, cudaStreamNonBlocking));
  AFD_CUDA_CHECK(cudaEventCreateWithFlags(&state_->fork, cudaEventDisableTiming));
  AFD_CUDA_CHECK(cudaEventCreateWithFlags(&state_->join, cudaEventDisableTiming));
  state_->stream = state_->main;
  AFD_CUBLAS_CHECK(cublasCreate(&state_->cublas));
  AFD_CUBLAS_CHECK(cublasSetStream(state_->cublas, state_->stream));
  // fp32 GEMMs stay fp32 (no TF32): the verification mode must match the CPU reference.
  AFD_CUBLAS_CHECK(cublasSetMathMode(state_->cublas, CUBLAS_PEDANTIC_MATH));
  state_->scratch.resize(2 * kNumSlots);
  state_->scratch_bytes.assign(2 * kNumSlots, 0);
  state_->cublas_workspace[0] = Allocate(kCublasWorkspaceBytes);
  state_->cublas_workspace[1] = Allocate(kCublasWorkspaceBytes);
  AFD_CUBLAS_CHECK(
      cublasSetWorkspace(state_->cublas, state_->cublas_workspace[0].get(), kCublasWorkspaceBytes));
  AFD_CUDA_CHECK(cudaMallocHost(&state_->staging, kStagingBytes));
  (void)ProbeRunningCode();  // now, never while a stream captures
}

CudaBackend::~CudaBackend() {
  if (state_->side) cudaStreamSynchronize(state_->side);
  if (state_->main) cudaStreamSynchronize(state_->main);
  state_->scratch.clear();
  state_->retired.clear();
  state_->expert_tables.clear();
  for (cudaEvent_t e : state_->events) cudaEventDestroy(e);
  for (auto [b, e] : state_->spans) {
    cudaEventDestroy(b);
    cudaEventDestroy(e);
  }
  if (state_->staging) cudaFreeHost(state_->staging);
  for (State::HostCopy& c : state_->host_copies) {
    if (c.pinned) cudaFreeHost(c.pinned);
    if (c.done) cudaEventDestroy(c.done);
  }
  if (state_->cublas) cublasDestroy(state_->cublas);
  if (state_->fork) cudaEventDestroy(state_->fork);
  if (state_->join) cudaEventDestroy(state_->join);
  if (state_->side) cudaStreamDestroy(state_->side);
  if (state_->main) cudaStreamDestroy(state_->main);
}

bool ChoiceOff(const char* name) { return EnvOff(name); }

int64_t ChoiceCount(const char* name, int64_t max) { return EnvCount(name, max); }

Stream CudaBackend::stream() const { return {state_->main}; }

void CudaBackend::Beside(FunctionRef<void()> fn, int64_t rows) {
  static const bool one_stream = ChoiceOff("AFD_SIDE_STREAM");
  // Prefill-sized work: two streams of large GEMMs contend (8192-token prefill of
  // deepseek-v2-lite on the H200: 424 ms with the side stream, 329 ms without).
  if (one_stream || rows > kBesideMaxRows) {
    fn();
    return;
  }
  AFD_CHECK(state_->lane == 0 && !state_->side_open, "{}: Beside while side work is open", name_);
  AFD_CUDA_CHECK(cudaEventRecord(state_->fork, state_->main));
  AFD_CUDA_CHECK(cudaStreamWaitEvent(state_->side, state_->fork, 0));
  const auto use = [&](int lane) {
    state_->lane = lane;
    state_->stream = lane == 0 ? state_->main : state_->side;
    // cublasSetStream drops the workspace: each stream has its own (concurrent GEMMs).
    AFD_CUBLAS_CHECK(cublasSetStream(state_->cublas, state_->stream));
    AFD_CUBLAS_CHECK(cublasSetWorkspace(state_->cublas, state_->cublas_workspace[lane].get(),
                                        kCublasWorkspaceBytes));
  };
  use(1);
  state_->side_open = true;
  try {
    fn();
  } catch (...) {
    use(0);
    JoinBeside();
    throw;
  }
  use(0);
}

// Programmatic dependent launch (pdl.cuh) for steps of up to this many rows. deepseek-v2-lite
// decode on the H200, ms/step with / without: batch 1 2.98 / 3.35, 16 8.64 / 8.69, 64 10.33 /
// 10.49, but 256 16.47 / 13.32 (blocks waiting for their predecessor hold SM resources that
// the side stream's kernels and large grids need).
constexpr int64_t kPdlMaxRows = 64;

void CudaBackend::SetStepRows(int64_t rows) { SetPdlForThread(rows <= kPdlMaxRows); }

void CudaBackend::JoinBeside() {
  if (!state_->side_open) return;
  AFD_CUDA_CHECK(cudaEventRecord(state_->join, state_->side));
  AFD_CUDA_CHECK(cudaStreamWaitEvent(state_->main, state_->join, 0));
  state_->side_open = false;
}

void CudaBackend::BindThread() { AFD_CUDA_CHECK(cudaSetDevice(device_)); }

Backend::MemoryInfo CudaBackend::DeviceMemory() const {
  AFD_CUDA_CHECK(cudaSetDevice(device_));
  size_t free_bytes = 0, total = 0;
  AFD_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total)};
}

std::shared_ptr<void> CudaBackend::Allocate(size_t bytes) {
  AFD_CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
  if (e != cudaSuccess) {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    AFD_THROW("{}: cannot allocate {:.2f} GiB ({}; {:.2f} GiB free of {:.2f})", name_,
              bytes / 1073741824.0, cudaGetErrorString(e), free_bytes / 1073741824.0,
              total / 1073741824.0);
  }
  const int device = device_;
  return std::shared_ptr<void>(p, [device](void* q) {
    cudaSetDevice(device);
    cudaFree(q);
  });
}

void* CudaBackend::Scratch(int slot_of_lane, size_t bytes) {
  const int slot = state_->lane * kNumSlots + slot_of_lane;  // each stream its own buffers
  if (state_->scratch_bytes[slot] < bytes) {
    // Queued work or a captured graph may still use the old buffer: keep it. Growing by at
    // least half bounds what is kept to about twice the largest buffer.
    const size_t size = std::max(bytes, state_->scratch_bytes[slot] * 3 / 2);
    if (state_->scratch[slot]) state_->retired.push_back(std::move(state_->scratch[slot]));
    state_->scratch[slot] = Allocate(size);
    state_->scratch_bytes[slot] = size;
  }
  return state_->scratch[slot].get();
}

void* CudaBackend::ZeroedScratch(int slot_of_lane, size_t bytes) {
  const int slot = state_->lane * kNumSlots + slot_of_lane;
  const void* before = state_->scratch[slot].get();
  void* p = Scratch(slot_of_lane, bytes);
  if (p != before) {
    AFD_CUDA_CHECK(cudaMemsetAsync(p, 0, state_->scratch_bytes[slot], state_->stream));
  }
  return p;
}

void CudaBackend::CopyToDevice(const Tensor& dst, const void* src) {
  CheckOn("CopyToDevice", dst, device_);
  AFD_CHECK(!state_->capturing, "CopyToDevice while capturing a graph");
  const size_t bytes = dst.nbytes();
  if (bytes == 0) return;
  const OpScope scope(*this, "CopyToDevice");
  if (bytes > kStagingBytes / 4) {  // big (weights): straight from the caller's memory, waited
    AFD_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyHostToDevice, state_->stream));
    Synchronize();
    return;
  }
  // The source is the caller's (possibly temporary) host memory: copied into the pinned ring
  // before returning; the device copy from the ring runs in stream order.
  AFD_CUDA_CHECK(cudaMemcpyAsync(dst.data(), Stage(src, bytes), bytes, cudaMemcpyHostToDevice,
                                 state_->stream));
}

const void* CudaBackend::Stage(const void* src, size_t bytes) {
  State& st = *state_;
  const uint64_t aligned = (bytes + 255) / 256 * 256;
  AFD_CHECK(aligned <= kStagingBytes, "staging: {} bytes exceed the ring's {}", bytes,
            kStagingBytes);
  const uint64_t at = st.staging_head % kStagingBytes;
  if (at + aligned > kStagingBytes) st.staging_head += kStagingBytes - at;  // wrap past the gap
  // The bytes from tail on may still be read by pending copies: wait for them all when the
  // ring would overwrite them.
  if (st.staging_head + aligned - st.staging_tail > kStagingBytes) Synchronize();
  char* stage = static_cast<char*>(st.staging) + st.staging_head % kStagingBytes;
  std::memcpy(stage, src, bytes);
  st.staging_head += aligned;
  return stage;
}

int64_t CudaBackend::StartCopyToHost(const Tensor& src) {
  CheckOn("StartCopyToHost", src, device_);
  AFD_CHECK(!state_->capturing, "StartCopyToHost while capturing a graph");
  JoinBeside();
  int slot = 0;
  const int64_t ticket = OpenCopyTicket(slot);
  State::HostCopy& c = state_->host_copies[slot];
  const size_t bytes = src.nbytes();
  try {
    if (bytes > c.capacity) {  // this slot's earlier copy is finished: its memory is free
      if (c.pinned) AFD_CUDA_CHECK(cudaFreeHost(c.pinned));
      c.pinned = nullptr;
      c.capacity = 0;
      AFD_CUDA_CHECK(cudaMallocHost(&c.pinned, std::max<size_t>(bytes, 4096)));
      c.capacity = std::max<size_t>(bytes, 4096);
    }
    if (!c.done) AFD_CUDA_CHECK(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming));
    c.bytes = bytes;
    if (bytes > 0) {
      AFD_CUDA_CHECK(
          cudaMemcpyAsync(c.pinned, src.data(), bytes, cudaMemcpyDeviceToHost, state_->stream));
    }
    AFD_CUDA_CHECK(cudaEventRecord(c.done, state_->stream));
  } catch (...) {
    CloseCopySlot(slot);
    throw;
  }
  c.staged = state_->staging_head;
  return ticket;
}

void CudaBackend::FinishCopyToHost(int64_t ticket, void* dst) {
  const int slot = CopySlot(ticket);
  State::HostCopy& c = state_->host_copies[slot];
  AwaitDone([&] { return static_cast<int>(cudaEventQuery(c.done)); },
            [&] { return static_cast<int>(cudaEventSynchronize(c.done)); });
  if (c.bytes > 0) std::memcpy(dst, c.pinned, c.bytes);
  state_->staging_tail = std::max(state_->staging_tail, c.staged);
  CloseCopySlot(slot);
}

void CudaBackend::CopyToHost(void* dst, const Tensor& src) {
  CheckOn("CopyToHost", src, device_);
  if (src.nbytes() == 0) return;
  const OpScope scope(*this, "CopyToHost");
  AFD_CUDA_CHECK(
      cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, state_->stream));
  Synchronize();
}

void CudaBackend::Copy(const Tensor& dst, const Tensor& src) {
  const OpScope scope(*this, "Copy");
  CheckOn("Copy", dst, device_);
  CheckOn("Copy", src, device_);
  AFD_CHECK(dst.nbytes() == src.nbytes() && dst.dtype() == src.dtype(), "Copy: {} from {}",
            dst.ToString(), src.ToString());
  if (dst.nbytes() == 0 || dst.data() == src.data()) return;
  AFD_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                 state_->stream));
}

void CudaBackend::Fill(const Tensor& dst, float value) {
  const OpScope scope(*this, "Fill");
  CheckOn("Fill", dst, device_);
  dst.Expect("Fill", DType::kF32, dst.shape());
  LaunchFill(dst.data_as<float>(), dst.numel(), value, state_->stream);
}

void CudaBackend::WatchWaits(double timeout_s, std::function<void()> check) {
  AFD_CHECK(timeout_s > 0, "{}: WatchWaits needs a positive timeout, got {}", name_, timeout_s);
  state_->wait_timeout_s = timeout_s;
  state_->wait_check = std::move(check);
}

void CudaBackend::Synchronize() {
  AFD_CHECK(!state_->capturing, "Synchronize while capturing a graph");
  JoinBeside();  // the side stream's work too
  AwaitDone([&] { return static_cast<int>(cudaStreamQuery(state_->stream)); },
            [&] { return static_cast<int>(cudaStreamSynchronize(state_->stream)); });
  AFD_CUDA_CHECK(cudaGetLastError());
  state_->staging_tail = state_->staging_head;  // every staged copy has completed
}

void CudaBackend::AwaitDone(FunctionRef<int()> query, FunctionRef<int()> block) {
  if (state_->wait_timeout_s <= 0) {
    AFD_CUDA_CHECK(static_cast<cudaError_t>(block()));
    return;
  }
  // Polled: yield for the first 50 ms (a step's work ends within them: no sleep adds to its
  // latency), then sleep 50 us between queries; the check runs every 100 ms and the wait ends
  // at the timeout.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_check = start + std::chrono::milliseconds(100);
  while (true) {
    const auto e = static_cast<cudaError_t>(query());
    if (e == cudaSuccess) break;
    AFD_CHECK(e == cudaErrorNotReady, "{}: the stream failed: {}", name_, cudaGetErrorString(e));
    const auto now = Clock::now();
    if (now >= next_check) {
      if (state_->wait_check) state_->wait_check();
      next_check = now + std::chrono::milliseconds(100);
    }
    AFD_CHECK(std::chrono::duration<double>(now - start).count() < state_->wait_timeout_s,
              "{}: the device's work did not finish within {}s (a transfer with a peer that "
              "stopped?)",
              name_, state_->wait_timeout_s);
    if (now - start < std::chrono::milliseconds(50)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void CudaBackend::BeginCapture() {
  AFD_CHECK(!state_->capturing, "{}: BeginCapture while capturing", name_);
  // Thread-local mode: other threads' CUDA calls are not affected; a forbidden call on this
  // thread (a synchronous copy, a sync) fails the capture instead of running.
  AFD_CUDA_CHECK(cudaStreamBeginCapture(state_->stream, cudaStreamCaptureModeThreadLocal));
  state_->capturing = true;
}

std::unique_ptr<OpGraph> CudaBackend::EndCapture() {
  AFD_CHECK(state_->capturing, "{}: EndCapture without BeginCapture", name_);
  JoinBeside();  // a capture ends with every forked stream joined
  state_->capturing = false;
  cudaGraph_t graph = nullptr;
  AFD_CUDA_CHECK(cudaStreamEndCapture(state_->stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  if (e != cudaSuccess) {
    cudaGraphDestroy(graph);
    AFD_THROW("{}: cudaGraphInstantiate failed: {}", name_, cudaGetErrorString(e));
  }
  return std::make_unique<CudaGraph>(graph, exec, state_->stream);
}

// The profiled ops are also the range an external profiler sees: `ncu --profile-from-start off`
// on `afd bench decode --profile` times the kernels of the decode steps only (no-op without one).
void CudaBackend::SetProfiling(bool on, bool profiler_range) {
  const bool range = on && profiler_range;
  if (range != state_->profiler_range) {
    AFD_CUDA_CHECK(range ? cudaProfilerStart() : cudaProfilerStop());
  }
  state_->profiler_range = range;
  state_->profiling = on;
}

std::vector<OpTime> CudaBackend::TakeProfile() {
  Synchronize();
  std::map<std::string, OpTime> by_op;
  for (const auto& [op, start] : state_->records) {
    float ms = 0.0f;
    AFD_CUDA_CHECK(cudaEventElapsedTime(&ms, state_->events[start], state_->events[start + 1]));
    OpTime& t = by_op[op];
    t.op = op;
    ++t.calls;
    t.ms += ms;
  }
  state_->records.clear();
  state_->events_used = 0;
  std::vector<OpTime> out;
  for (auto& [op, t] : by_op) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

void CudaBackend::SetKernelTrace(bool on) {
  if (on == KernelTraceOn()) return;
  if (on) {
    StartKernelTrace();
  } else {
    Synchronize();
    StopKernelTrace();
  }
}

std::vector<KernelSpan> CudaBackend::TakeKernelTrace() {
  AFD_CHECK(KernelTraceOn(), "{}: TakeKernelTrace without SetKernelTrace(true)", name_);
  Synchronize();
  return StopKernelTrace();
}

void CudaBackend::BeginTimedSpan() {
  AFD_CHECK(!state_->capturing, "{}: a timed span cannot begin while capturing a graph", name());
  if (state_->spans_used == state_->spans.size()) {
    cudaEvent_t b, e;
    AFD_CUDA_CHECK(cudaEventCreate(&b));
    AFD_CUDA_CHECK(cudaEventCreate(&e));
    state_->spans.emplace_back(b, e);
  }
  AFD_CUDA_CHECK(cudaEventRecord(state_->spans[state_->spans_used].first, state_->stream));
}

void CudaBackend::EndTimedSpan() {
  AFD_CHECK(!state_->capturing, "{}: a timed span cannot end while capturing a graph", name());
  AFD_CHECK(state_->spans_used < state_->spans.size(), "{}: EndTimedSpan without a begin", name());
  AFD_CUDA_CHECK(cudaEventRecord(state_->spans[state_->spans_used++].second, state_->stream));
}

double CudaBackend::TakeTimedSeconds() {
  Synchronize();
  double seconds = 0.0;
  for (size_t i = 0; i < state_->spans_used; ++i) {
    float ms = 0.0f;
    AFD_CUDA_CHECK(cudaEventElapsedTime(&ms, state_->spans[i].first, state_->spans[i].second));
    seconds += ms / 1e3;
  }
  state_->spans_used = 0;
  return seconds;
}

void CudaBackend::Embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const auto [n, h] = CheckEmbedding(device(), table, ids, out);
  const OpScope scope(*this, "Embedding");
  LaunchEmbedding(table.data(), table.dtype() == DType::kBF16, ids.data_as<const int32_t>(), n, h,
                  out.data_as<float>(), state_->stream);
}

void CudaBackend::Linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  const auto [n, k, m] = CheckLinear(device(), x, w, y);
  if (n == 0) return;
  const OpScope scope(*this, "Linear", {n, k, m});
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[n, m] = x[n, k] · w[m, k]ᵀ is column-major yᵀ[m, n] = w · xᵀ.
  if (w.dtype() == DType::kF32) {
    // A few rows (decode; the router gate in every model): cuBLAS picks kernels that take ~50 us
    // for a 1x2048x64 product (~20 us at 16 x 2048 x 64); one warp per output column streams the
    // weights instead (9-16 rows of <= 256 columns: one launch, a block per 8 rows; at 17-64
    // rows cuBLAS was faster in the decode graph, at 9-16 slower).
    if (GemvF32Fits(n, k, m) && Aligned16(x.data()) && Aligned16(w.data())) {
      LaunchGemvF32(x.data_as<const float>(), n, k, w.data_as<const float>(), m, y.data_as<float>(),
                    state_->stream);
      return;
    }
    if (SkinnyF32Fits(n, k, m) && Aligned16(x.data()) && Aligned16(w.data())) {
      LaunchSkinnyF32(x.data_as<const float>(), n, k, w.data_as<const float>(), m,
                      y.data_as<float>(), state_->stream);
      return;
    }
    AFD_CUBLAS_CHECK(cublasSgemm(state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha,
                                 w.data_as<const float>(), k, x.data_as<const float>(), k, &beta,
                                 y.data_as<float>(), m));
    return;
  }
  if (GemvFits(n, k) && Aligned16(x.data()) && Aligned16(w.data())) {
    // A few rows: stream the weights once, near the copy rate, x rounded to bf16 as it is read.
    LaunchGemvBf16(x.data_as<const float>(), n, k, w.data(), m, y.data_as<float>(), state_->stream);
    return;
  }
  auto* xb = static_cast<uint16_t*>(Scratch(kBf16Input, n * k * 2));
  LaunchToBf16(x.data_as<const float>(), n * k, xb, state_->stream);
  if (TiledLinearFits(n, k, m) && Aligned16(w.data())) {
    LaunchTiledLinear(xb, n, k, w.data(), m, y.data_as<float>(), state_->stream);
    return;
  }
  AFD_CUBLAS_CHECK(cublasGemmEx(state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.data(),
                                CUDA_R_16BF, k, xb, CUDA_R_16BF, k, &beta, y.data(), CUDA_R_32F, m,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  const auto [n, d] = CheckRmsNorm(device(), x, w, out);
  const OpScope scope(*this, "RmsNorm", {n, d});
  LaunchRmsNorm(x.data_as<const float>(), n, d, w.data_as<const float>(), eps, out.data_as<float>(),
                state_->stream);
}

void CudaBackend::Add(const Tensor& y, const Tensor& x) {
  CheckAdd(device(), y, x);
  const OpScope scope(*this, "Add");
  LaunchAdd(y.data_as<float>(), x.data_as<const float>(), y.numel(), state_->stream);
}

void CudaBackend::AddRmsNorm(const Tensor& y, const Tensor& x, const Tensor& w, float eps,
                             const Tensor& out) {
  CheckAdd(device(), y, x);
  const auto [n, d] = CheckRmsNorm(device(), y, w, out);
  AFD_CHECK(out.data() != y.data() && out.data() != x.data(),
            "AddRmsNorm: out must not alias y or x");
  const OpScope scope(*this, "AddRmsNorm", {n, d});
  LaunchAddRmsNorm(y.data_as<float>(), x.data_as<const float>(), n, d, w.data_as<const float>(),
                   eps, out.data_as<float>(), state_->stream);
}

void CudaBackend::SiluMul(const Tensor& gate_up, const Tensor& out) {
  const auto [n, inter] = CheckSiluMul(device(), gate_up, out);
  const OpScope scope(*this, "SiluMul", {n, inter});
  LaunchSiluMul(gate_up.data_as<const float>(), n, inter, out.data_as<float>(), state_->stream);
}

void CudaBackend::Rope(const Tensor& x, int64_t offset, const Tensor& positions,
                       const RopeSpec& rope) {
  const auto [n, heads, width] = CheckRope(device(), x, offset, positions, rope);
  const OpScope scope(*this, "Rope");
  LaunchRope(x.data_as<float>(), n, heads, width, offset, positions.data_as<const int64_t>(),
             cuda::Rope(rope), state_->stream);
}

void CudaBackend::GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const auto [m, h] = CheckGatherRows(device(), x, index, out);
  const OpScope scope(*this, "GatherRows", {m, h});
  LaunchGatherRows(x.data_as<const float>(), index.data_as<const int32_t>(), m, h,
                   out.data_as<float>(), state_->stream);
}

void CudaBackend::MlaCacheWrite(const Tensor& ckv, const Tensor& norm_w, float eps,
                                const AttentionTokens& tokens, const RopeSpec& rope,
                                const Tensor& cache) {
  const auto [n, kvr, width] = CheckMlaCacheWrite(device(), ckv, norm_w, tokens, rope, cache);
  const OpScope scope(*this, "MlaCacheWrite");
  LaunchMlaCacheWrite(ckv.data_as<const float>(), n, kvr, norm_w.data_as<const float>(), eps,
                      Paged(tokens), cuda::Rope(rope), cache.data(), cache.dtype() == DType::kBF16,
                      state_->stream);
}

void CudaBackend::MlaAttention(const Tensor& q, const Tensor& kv_b, const AttentionTokens& tokens,
                               const Tensor& cache, int64_t head_begin, int64_t head_end,
                               int64_t dn, int64_t dv, float scale, const Tensor& out) {
  const auto [n, heads, kvr, dr] =
      CheckMlaAttention(device(), q, kv_b, tokens, cache, head_begin, head_end, dn, dv, out);
  const OpScope scope(*this, "MlaAttention", {n, head_end - head_begin});
  // The context bound: the host's hint, else the block tables' width.
  const int64_t max_context =
      tokens.max_context > 0 ? tokens.max_context : tokens.block_tables.dim(1) * tokens.block_size;
  const int64_t nh = head_end - head_begin;
  const bool tiles = MlaTilesFit(kvr, dr, cache.dtype() == DType::kBF16, tf32_);
  const int64_t seqs = tokens.block_tables.dim(0);
  if (tiles && !state_->capturing && MlaPrefillFits(n, seqs, max_context, dn, dr, dv, kvr, nh) &&
      Aligned16(cache.data())) {
    // Mostly new tokens: the expanded form (mla_prefill.cu), 3.4x fewer FLOPs than the absorbed.
    const int64_t width = kvr + dr, rows = seqs * max_context, ldkv = nh * (dn + dv);
    void* ctx = Scratch(kMlaPrefillCtx, rows * width * 2);
    auto* kvb = static_cast<uint16_t*>(Scratch(kMlaPrefillKvb, ldkv * kvr * 2));
    void* kv = Scratch(kMlaPrefillKv, rows * ldkv * 2);
    LaunchMlaGatherContext(tokens.block_tables.data_as<const int32_t>(), seqs,
                           tokens.block_tables.dim(1), tokens.block_size,
                           cache.dim(0) / tokens.block_size, max_context, cache.data(), width, ctx,
                           state_->stream);
    LaunchToBf16(kv_b.data_as<const float>() + head_begin * (dn + dv) * kvr, ldkv * kvr, kvb,
                 state_->stream);
    // kv [rows, ldkv] = ctx[:, :kvr] · kv_bᵀ (column-major: kvᵀ = kv_b_colᵀ · ctx_col).
    const float one = 1.0f, zero = 0.0f;
    AFD_CUBLAS_CHECK(cublasGemmEx(state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, ldkv, rows, kvr, &one,
                                  kvb, CUDA_R_16BF, kvr, ctx, CUDA_R_16BF, width, &zero, kv,
                                  CUDA_R_16BF, ldkv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    LaunchMlaPrefill(q.data_as<const float>(), n, heads, head_begin, nh,
                     tokens.positions.data_as<const int64_t>(),
                     tokens.seq_index.data_as<const int32_t>(), kv, ctx, width, kvr, max_context,
                     scale, out.data_as<float>(), state_->stream);
    return;
  }
  const int64_t splits = MlaSplits(n, nh, max_context, tiles, state_->sm_count);
  // The tiled kernel with one split writes o_lat directly: no partials (at prefill they would
  // take n x heads x (kvr + 2) floats).
  auto* partial = tiles && splits == 1
                      ? nullptr
                      : static_cast<float*>(Scratch(
                            kMlaPartial, MlaPartialFloats(n, nh, splits, kvr) * sizeof(float)));
  auto* counters = static_cast<int*>(ZeroedScratch(kMlaCounters, MlaCounters(n, nh) * sizeof(int)));
  // q_lat, o_lat: [n, nh, kvr] each.
  auto* q_lat = static_cast<float*>(Scratch(kMlaLatent, 2 * n * nh * kvr * sizeof(float)));
  float* o_lat = q_lat + n * nh * kvr;
  // Per head h (batched, fp32): q_lat_h [n, kvr] = q_nope_h [n, dn] · W_k[h] [dn, kvr]; in
  // column-major terms q_lat_hᵀ = W_k[h]ᵀ · q_nope_hᵀ (W_k rows are kvr wide, so no transpose).
  const float one = 1.0f, zero = 0.0f;
  const float* w_k = kv_b.data_as<const float>() + head_begin * (dn + dv) * kvr;
  const float* w_v = w_k + dn * kvr;
  if (MlaProjectionsFit(n, dn, kvr) && Aligned16(kv_b.data())) {
    // A few tokens: the projections as streaming kernels (cuBLAS is latency-bound here).
    LaunchMlaQLat(q.data_as<const float>(), n, heads, dn, dr, dv, kv_b.data_as<const float>(),
                  head_begin, head_end, kvr, q_lat, state_->stream);
    LaunchMlaAttention(q.data_as<const float>(), n, heads, q_lat, kvr, dn, dr, Paged(tokens),
                       cache.data(), cache.dim(0), cache.dtype() == DType::kBF16, head_begin,
                       head_end, scale, max_context, splits, tf32_, partial, counters, o_lat,
                       state_->sm_count, state_->stream);
    LaunchMlaOut(o_lat, n, dn, dv, kv_b.data_as<const float>(), head_begin, head_end, kvr,
                 out.data_as<float>(), state_->stream);
    return;
  }
  // fp32 batched GEMMs; TF32 tensor cores when allowed (AllowTf32: bf16 models).
  const cublasComputeType_t compute = tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  AFD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      state_->cublas, CUBLAS_OP_N, CUBLAS_OP_N, kvr, n, dn, &one, w_k, CUDA_R_32F, kvr,
      (dn + dv) * kvr, q.data_as<const float>() + head_begin * (dn + dr), CUDA_R_32F,
      heads * (dn + dr), dn + dr, &zero, q_lat, CUDA_R_32F, nh * kvr, kvr, nh, compute,
      CUBLAS_GEMM_DEFAULT));
  LaunchMlaAttention(q.data_as<const float>(), n, heads, q_lat, kvr, dn, dr, Paged(tokens),
                     cache.data(), cache.dim(0), cache.dtype() == DType::kBF16, head_begin,
                     head_end, scale, max_context, splits, tf32_, partial, counters, o_lat,
                     state_->sm_count, state_->stream);
  // out_h [n, dv] = o_lat_h [n, kvr] · W_v[h]ᵀ (W_v[h]: [dv, kvr]).
  AFD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, dv, n, kvr, &one, w_v, CUDA_R_32F, kvr,
      (dn + dv) * kvr, o_lat, CUDA_R_32F, nh * kvr, kvr, &zero, out.data_as<float>(), CUDA_R_32F,
      nh * dv, dv, nh, compute, CUBLAS_GEMM_DEFAULT));
}

namespace {

RouterArgs ToRouterArgs(const RouterSpec& spec) {
  return {spec.scoring == RouterScoring::kSigmoid,
          spec.group_limited,
          spec.top_k,
          spec.n_group,
          spec.topk_group,
          spec.norm_topk_prob,
          spec.norm_eps,
          spec.routed_scaling_factor};
}

}  // namespace

void CudaBackend::GqaCacheWrite(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                float eps, const AttentionTokens& tokens, const RopeSpec& rope,
                                const Tensor& q, const Tensor& cache) {
  const auto [n, heads, kvh, d] =
      CheckGqaCacheWrite(device(), qkv, q_norm, k_norm, tokens, rope, q, cache);
  const OpScope scope(*this, "GqaCacheWrite", {n, heads + kvh});
  LaunchGqaCacheWrite(qkv.data_as<const float>(), n, heads, kvh, d, q_norm.data_as<const float>(),
                      k_norm.data_as<const float>(), eps, Paged(tokens), cuda::Rope(rope),
                      q.data_as<float>(), cache.data(), cache.dtype() == DType::kBF16,
                      state_->stream);
}

void CudaBackend::GqaAttention(const Tensor& q, const AttentionTokens& tokens, const Tensor& cache,
                               int64_t num_kv_heads, int64_t head_begin, int64_t head_end,
                               float scale, const Tensor& out) {
  const auto [n, heads, kvh, d] =
      CheckGqaAttention(device(), q, tokens, cache, num_kv_heads, head_begin, head_end, out);
  const OpScope scope(*this, "GqaAttention", {n, head_end - head_begin});
  const int64_t max_context =
      tokens.max_context > 0 ? tokens.max_context : tokens.block_tables.dim(1) * tokens.block_size;
  const bool bf16_cache = cache.dtype() == DType::kBF16;
  const GqaForm form = GqaChooseForm(d, bf16_cache, tf32_, n, tokens.block_tables.dim(0));
  const int64_t splits =
      GqaSplits(n, heads, kvh, head_begin, head_end, max_context, form, state_->sm_count);
  const int64_t floats = GqaPartialFloats(n, head_end - head_begin, splits, d);
  float* partial =
      floats > 0 ? static_cast<float*>(Scratch(kGqaPartial, floats * sizeof(float))) : nullptr;
  LaunchGqaAttention(q.data_as<const float>(), n, heads, kvh, d, Paged(tokens), cache.data(),
                     bf16_cache, head_begin, head_end, scale, splits, form, partial,
                     out.data_as<float>(), state_->stream);
}

void CudaBackend::RouterTopk(const Tensor& logits, const Tensor& bias, const RouterSpec& spec,
                             const Tensor& ids, const Tensor& weights) {
  const auto [n, e] = CheckRouterTopk(device(), logits, bias, spec, ids, weights);
  const OpScope scope(*this, "RouterTopk", {n, e});
  const RouterArgs a = ToRouterArgs(spec);
  LaunchRouterTopk(logits.data_as<const float>(), n, e,
                   bias.empty() ? nullptr : bias.data_as<const float>(), a, ids.data_as<int32_t>(),
                   weights.data_as<float>(), state_->stream);
}

void CudaBackend::RouterGateTopk(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                                 const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                                 const Tensor& weights) {
  const auto [n, k, e] = CheckLinear(device(), hidden, gate, logits);
  CheckRouterTopk(device(), logits, bias, spec, ids, weights);
  const RouterArgs a = ToRouterArgs(spec);
  static const bool fused_off = ChoiceOff("AFD_ROUTER_FUSED");  // Linear, then RouterTopk
  static const bool rows_off = ChoiceOff("AFD_ROUTER_ROWS");    // so from 65 tokens on
  const bool one_gemv = RouterGateTopkFits(n, k, e, a);
  if (fused_off || gate.dtype() != DType::kF32 || !Aligned16(hidden.data()) ||
      !Aligned16(gate.data()) || !(one_gemv || (!rows_off && RouterRowsFits(n, k, e, a)))) {
    Backend::RouterGateTopk(hidden, gate, bias, spec, logits, ids, weights);
    return;
  }
  const OpScope scope(*this, "RouterGateTopk", {n, e});
  if (!one_gemv) {  // 65-511 tokens
    auto* counters = static_cast<unsigned int*>(
        ZeroedScratch(kRouterRowsCounters, RouterRowsCounters(n) * sizeof(unsigned int)));
    LaunchRouterRows(hidden.data_as<const float>(), n, k, gate.data_as<const float>(), e,
                     logits.data_as<float>(), bias.empty() ? nullptr : bias.data_as<const float>(),
                     a, ids.data_as<int32_t>(), weights.data_as<float>(), counters, state_->stream);
    return;
  }
  auto* counter = static_cast<unsigned int*>(ZeroedScratch(kRouterCounter, sizeof(unsigned int)));
  LaunchRouterGateTopk(
      hidden.data_as<const float>(), n, k, gate.data_as<const float>(), e, logits.data_as<float>(),
      bias.empty() ? nullptr : bias.data_as<const float>(), a, ids.data_as<int32_t>(),
      weights.data_as<float>(), PermuteArgs{}, counter, state_->stream);
}

void CudaBackend::RouteAndPermute(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                                  const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                                  const Tensor& weights, int64_t begin, int64_t num_local,
                                  const Tensor& offsets, const Tensor& src_row,
                                  const Tensor& row_of_slot) {
  const auto [n, k, e] = CheckLinear(device(), hidden, gate, logits);
  CheckRouterTopk(device(), logits, bias, spec, ids, weights);
  CheckMoePermute(device(), ids, num_local, offsets, src_row, row_of_slot);
  const RouterArgs a = ToRouterArgs(spec);
  static const bool off = ChoiceOff("AFD_ROUTER_PERMUTE");  // RouterGateTopk, then MoePermute
  static const bool fused_off = ChoiceOff("AFD_ROUTER_FUSED");
  if (off || fused_off || gate.dtype() != DType::kF32 || !RouterGateTopkFits(n, k, e, a) ||
      !RouterPermuteFits(n, a, num_local) || !Aligned16(hidden.data()) || !Aligned16(gate.data())) {
    Backend::RouteAndPermute(hidden, gate, bias, spec, logits, ids, weights, begin, num_local,
                             offsets, src_row, row_of_slot);
    return;
  }
  const OpScope scope(*this, "RouteAndPermute", {n, e});
  auto* counter = static_cast<unsigned int*>(ZeroedScratch(kRouterCounter, sizeof(unsigned int)));
  const PermuteArgs p{begin, static_cast<int>(num_local), offsets.data_as<int32_t>(),
                      src_row.data_as<int32_t>(), row_of_slot.data_as<int32_t>()};
  LaunchRouterGateTopk(
      hidden.data_as<const float>(), n, k, gate.data_as<const float>(), e, logits.data_as<float>(),
      bias.empty() ? nullptr : bias.data_as<const float>(), a, ids.data_as<int32_t>(),
      weights.data_as<float>(), p, counter, state_->stream);
}

void CudaBackend::MoePermute(const Tensor& ids, int64_t begin, int64_t num_local,
                             const Tensor& offsets, const Tensor& src_row,
                             const Tensor& row_of_slot) {
  const auto [n, k] = CheckMoePermute(device(), ids, num_local, offsets, src_row, row_of_slot);
  const OpScope scope(*this, "MoePermute");
  const int64_t scratch_ints = MoePermuteScratchInts(n, k, num_local);
  auto* scratch =
      scratch_ints > 0
          ? static_cast<int32_t*>(Scratch(kPermuteCounts, scratch_ints * sizeof(int32_t)))
          : nullptr;
  LaunchMoePermute(ids.data_as<const int32_t>(), n, k, begin, num_local, offsets.data_as<int32_t>(),
                   src_row.data_as<int32_t>(), row_of_slot.data_as<int32_t>(), scratch,
                   state_->stream);
}

const void* const* CudaBackend::ExpertTable(const ExpertWeights& experts, int kind) {
  const std::vector<Tensor>& list = kind == 0 ? experts.gate_up : experts.down;
  std::vector<const void*> ptrs;
  for (size_t e = 0; e < list.size(); ++e) {
    AFD_CHECK(!list[e].empty(), "routed expert {} is not loaded on {}",
              experts.expert_begin + static_cast<int64_t>(e), name_);
    CheckOn("GroupedExpertMlp", list[e], device_);
    ptrs.push_back(list[e].data());
  }
  State::ExpertTable& table = state_->expert_tables[std::make_pair(ptrs.front(), kind)];
  if (table.ptrs != ptrs) {
    Synchronize();  // an older table at this key may still be read by queued work
    table.device = Allocate(ptrs.size() * sizeof(void*));
    AFD_CUDA_CHECK(cudaMemcpy(table.device.get(), ptrs.data(), ptrs.size() * sizeof(void*),
                              cudaMemcpyHostToDevice));
    table.ptrs = ptrs;
  }
  return static_cast<const void* const*>(table.device.get());
}

void CudaBackend::GroupedExpertMlp(const Tensor& x, const Tensor& offsets,
                                   const ExpertWeights& experts, const Tensor& out) {
  const auto [m, h] = CheckGroupedExpertMlp(device(), x, offsets, experts, out);
  const int64_t e = experts.num_experts();
  if (e == 0 || m == 0) return;
  const OpScope scope(*this, "GroupedExpertMlp", {m, h});
  if (MmaExpertMlp(x.data_as<const float>(), nullptr, m, h, offsets, experts, out)) return;
  const int64_t inter = experts.down.front().dim(1);
  const bool bf16 = experts.gate_up.front().dtype() == DType::kBF16;
  auto* act = static_cast<float*>(Scratch(kMoeAct, m * inter * sizeof(float)));  // [m, I]
  auto* xb =
      bf16 ? static_cast<uint16_t*>(Scratch(kBf16Input, m * std::max(h, inter) * 2)) : nullptr;
  LaunchGroupedLinear(x.data_as<const float>(), m, h, ExpertTable(experts, 0), bf16,
                      offsets.data_as<const int32_t>(), e, inter, /*swiglu=*/true, act, xb,
                      state_->stream);
  LaunchGroupedLinear(act, m, inter, ExpertTable(experts, 1), bf16,
                      offsets.data_as<const int32_t>(), e, h, /*swiglu=*/false,
                      out.data_as<float>(), xb, state_->stream);
}

bool CudaBackend::MmaExpertMlp(const float* x, const int32_t* src_row, int64_t m, int64_t h,
                               const Tensor& offsets, const ExpertWeights& experts,
                               const Tensor& out) {
  // bf16 experts of decode and mid-sized groups: both GEMMs on tensor cores with a bf16
  // intermediate (the act scratch holds it).
  if (experts.gate_up.front().dtype() != DType::kBF16) return false;
  const int64_t inter = experts.down.front().dim(1);
  auto* act = static_cast<uint16_t*>(Scratch(kMoeAct, m * inter * sizeof(float)));
  auto* xb = static_cast<uint16_t*>(Scratch(kBf16Input, m * std::max(h, inter) * 2));
  return LaunchGroupedMlpMma(x, src_row, m, h, inter, ExpertTable(experts, 0),
                             ExpertTable(experts, 1), offsets.data_as<const int32_t>(),
                             experts.num_experts(), xb, act, out.data_as<float>(), state_->stream);
}

void CudaBackend::GatheredExpertMlp(const Tensor& x, const Tensor& src_row, const Tensor& grouped,
                                    const Tensor& offsets, const ExpertWeights& experts,
                                    const Tensor& out) {
  const auto [m, h] = CheckGatherRows(device(), x, src_row, grouped);
  CheckGroupedExpertMlp(device(), grouped, offsets, experts, out);
  if (experts.num_experts() == 0 || m == 0) return;
  if (Aligned16(x.data())) {
    // The mma path rounds its rows to bf16 first: gathered on the way (no fp32 copy).
    const OpScope scope(*this, "GroupedExpertMlp", {m, h});
    if (MmaExpertMlp(x.data_as<const float>(), src_row.data_as<const int32_t>(), m, h, offsets,
                     experts, out)) {
      return;
    }
  }
  GatherRows(x, src_row, grouped);
  GroupedExpertMlp(grouped, offsets, experts, out);
}

void CudaBackend::MoeCombine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                             bool accumulate, const Tensor& out) {
  const auto [n, k, h] = CheckMoeCombine(device(), y, row_of_slot, weights, out);
  const OpScope scope(*this, "MoeCombine", {n, h});
  LaunchMoeCombine(y.data_as<const float>(), h, row_of_slot.data_as<const int32_t>(),
                   weights.data_as<const float>(), n, k, accumulate, nullptr, out.data_as<float>(),
                   state_->stream);
}

void CudaBackend::MoeCombineAdd(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                                const Tensor& addend, const Tensor& out) {
  const auto [n, k, h] = CheckMoeCombine(device(), y, row_of_slot, weights, out);
  CheckAdd(device(), out, addend);
  const OpScope scope(*this, "MoeCombine", {n, h});
  LaunchMoeCombine(y.data_as<const float>(), h, row_of_slot.data_as<const int32_t>(),
                   weights.data_as<const float>(), n, k, /*accumulate=*/false,
                   addend.data_as<const float>(), out.data_as<float>(), state_->stream);
}

void CudaBackend::LogSoftmaxAt(const Tensor& logits, const Tensor& ids, const Tensor& out) {
  const auto [n, v] = CheckLogSoftmaxAt(device(), logits, ids, out);
  const OpScope scope(*this, "LogSoftmaxAt");
  LaunchLogSoftmaxAt(logits.data_as<const float>(), n, v, ids.data_as<const int32_t>(),
                     out.data_as<float>(), Scratch(kSampleReduce, SampleReduceBytes(n, v)),
                     state_->stream);
}

void CudaBackend::Sample(const Tensor& logits, const std::vector<SampleRow>& rows,
                         const Tensor& ids) {
  const auto [n, v] = CheckSample(device(), logits, rows, ids);
  const OpScope scope(*this, "Sample");
  LaunchArgMax(logits.data_as<const float>(), n, v, ids.data_as<int32_t>(),
               Scratch(kSampleReduce, SampleReduceBytes(n, v)), state_->stream);
  const bool any_sampled =
      std::any_of(rows.begin(), rows.end(), [](const SampleRow& r) { return r.temperature > 0; });
  if (!any_sampled || n == 0) return;
  // Per-row parameters, 8-byte fields first so that every array is aligned for any n:
  // [u f64 x n | top_k i64 x n | temperature f32 x n | top_p f32 x n].
  const size_t u_at = 0, top_k_at = 8 * n, temp_at = 16 * n, top_p_at = 20 * n;
  std::vector<double> host_words((24 * n + 7) / 8);  // 8-byte aligned host staging
  char* p = reinterpret_cast<char*>(host_words.data());
  auto* u = reinterpret_cast<double*>(p + u_at);
  auto* top_k = reinterpret_cast<int64_t*>(p + top_k_at);
  auto* temp = reinterpret_cast<float*>(p + temp_at);
  auto* top_p = reinterpret_cast<float*>(p + top_p_at);
  for (int64_t i = 0; i < n; ++i) {
    temp[i] = rows[i].temperature;
    top_k[i] = rows[i].top_k;
    top_p[i] = rows[i].top_p;
    u[i] = rows[i].u;
  }
  const size_t bytes = 24 * n;
  char* dev = static_cast<char*>(Scratch(kSampleParams, bytes));
  // From the pinned ring: the copy runs in stream order, nothing waits for it here.
  AFD_CUDA_CHECK(
      cudaMemcpyAsync(dev, Stage(p, bytes), bytes, cudaMemcpyHostToDevice, state_->stream));
  const SampleParamsDev params{reinterpret_cast<const float*>(dev + temp_at),
                               reinterpret_cast<const int64_t*>(dev + top_k_at),
                               reinterpret_cast<const float*>(dev + top_p_at),
                               reinterpret_cast<const double*>(dev + u_at)};
  // keys/vals in (2 n v) and out (2 n v), offsets (n + 1).
  auto* keys = static_cast<float*>(Scratch(kSortKeys, 2 * n * v * sizeof(float)));
  auto* vals = static_cast<int32_t*>(Scratch(kSortVals, (2 * n * v + n + 1) * sizeof(int32_t)));
  int32_t* offsets = vals + 2 * n * v;
  LaunchPrepareSort(logits.data_as<const float>(), n, v, keys, vals, offsets, state_->stream);
  const size_t temp_bytes = SegmentedSortTempBytes(n, v);
  void* sort_temp = Scratch(kSortTemp, temp_bytes);
  SegmentedSortDescending(sort_temp, temp_bytes, keys, keys + n * v, vals, vals + n * v, n, v,
                          offsets, state_->stream);
  LaunchSampleSorted(keys + n * v, vals + n * v, n, v, params, ids.data_as<int32_t>(),
                     state_->stream);
}

void CudaBackend::TakeIds(const Tensor& from, const Tensor& source, const Tensor& ids) {
  const int64_t n = CheckTakeIds(device(), from, source, ids);
  const OpScope scope(*this, "TakeIds");
  LaunchTakeIds(from.data_as<const int32_t>(), source.data_as<const int32_t>(), n,
                ids.data_as<int32_t>(), state_->stream);
}

namespace {

AfdRankPtrs RankPtrs(const std::vector<Tensor>& ts) {
  AfdRankPtrs p{};
  for (size_t f = 0; f < ts.size(); ++f) p.p[f] = ts[f].data();
  return p;
}

AfdRankInts RankInts(const std::vector<int64_t>& v) {
  AfdRankInts r{};
  for (size_t f = 0; f < v.size(); ++f) r.v[f] = v[f];
  return r;
}

}  // namespace

void CudaBackend::AfdDispatch(const Tensor& hidden, const Tensor& ids, const Tensor& weights,
                              int64_t num_experts, const std::vector<Tensor>& rows,
                              const std::vector<Tensor>& tables, const Tensor& send_row,
                              bool shared) {
  const AfdShape a =
      CheckAfdDispatch(device(), hidden, ids, weights, num_experts, rows, tables, send_row);
  const OpScope scope(*this, "AfdDispatch", {a.n, a.h});
  uint64_t bf16_mask = 0;
  for (int f = 0; f < a.ranks; ++f) {
    if (rows[f].dtype() == DType::kBF16) bf16_mask |= uint64_t{1} << f;
  }
  LaunchAfdDispatch(hidden.data_as<const float>(), ids.data_as<const int32_t>(),
                    weights.data_as<const float>(), a.n, a.k, a.h, num_experts, a.ranks,
                    RankPtrs(rows), bf16_mask, RankPtrs(tables), send_row.data_as<int32_t>(),
                    shared, state_->stream);
}

void CudaBackend::AfdSumPartials(const std::vector<Tensor>& partials, const Tensor& send_row,
                                 const Tensor& out) {
  const AfdShape a = CheckAfdSumPartials(device(), partials, send_row, out);
  const OpScope scope(*this, "AfdSumPartials", {a.n, a.h});
  LaunchAfdSumPartials(RankPtrs(partials), send_row.data_as<const int32_t>(), a.n, a.h, a.ranks,
                       out.data_as<float>(), state_->stream);
}

void CudaBackend::AfdPairIndex(const Tensor& ids, int64_t num_experts, const Tensor& send_row,
                               const std::vector<Tensor>& row_of_slot,
                               const std::vector<int64_t>& base,
                               const std::vector<int64_t>& shared_base, const Tensor& idx,
                               const Tensor& shared_idx) {
  const AfdShape a = CheckAfdPairIndex(device(), ids, num_experts, send_row, row_of_slot, base,
                                       shared_base, idx, shared_idx);
  const OpScope scope(*this, "AfdPairIndex", {a.n, a.k});
  LaunchAfdPairIndex(ids.data_as<const int32_t>(), a.n, a.k, num_experts, a.ranks,
                     send_row.data_as<const int32_t>(), RankPtrs(row_of_slot), RankInts(base),
                     RankInts(shared_base), idx.data_as<int32_t>(),
                     shared_idx.empty() ? nullptr : shared_idx.data_as<int32_t>(), state_->stream);
}

void CudaBackend::Convert(const Tensor& dst, const Tensor& src) {
  const int64_t n = CheckConvert(device(), dst, src);
  if (dst.dtype() == src.dtype()) {
    Copy(dst, src);
    return;
  }
  const OpScope scope(*this, "Convert", {n});
  if (dst.dtype() == DType::kF32) {
    LaunchBf16ToF32(src.data_as<const uint16_t>(), n, dst.data_as<float>(), state_->stream);
  } else {
    LaunchToBf16(src.data_as<const float>(), n, dst.data_as<uint16_t>(), state_->stream);
  }
}

}  // namespace afd::kernels::cuda

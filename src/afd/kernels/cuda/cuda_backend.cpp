// The CUDA backend's state: device, streams (the main one, Beside's side stream and their events),
// memory (allocation, per-lane scratch, the pinned staging ring, copies to and from the host),
// waits, CUDA graph capture, op profiles, kernel traces and timed spans. Its ops:
// cuda_backend_ops.cpp.
#include "afd/kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda.h>
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
#include "afd/common/cuda_driver.h"
#include "afd/common/env_switches.h"
#include "afd/common/error.h"
#include "afd/kernels/cuda/afd.cuh"
#include "afd/kernels/cuda/cuda_backend_state.h"
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

namespace {

constexpr size_t kStagingBytes = size_t{16} << 20;
constexpr size_t kCublasWorkspaceBytes = size_t{64} << 20;
// Beside with more rows runs in place (prefill: its GEMMs fill the GPU alone).
constexpr int64_t kBesideMaxRows = 1024;
constexpr int64_t kMaxMlaSplitsForced = 64;  // kMaxMlaSplits (mla_decode.cuh)

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
  fp8_mma_ = prop.major * 10 + prop.minor >= 89;
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
  for (const auto& [handle, map] : state_->ipc_maps) cudaIpcCloseMemHandle(map.base);
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

void CudaBackend::SetFormOverrides(const FormOverrides& forms) {
  AFD_CHECK(forms.mla_splits >= 0 && forms.mla_splits <= kMaxMlaSplitsForced,
            "MLA decode splits {}: 0 (chosen) or 1..{}", forms.mla_splits, kMaxMlaSplitsForced);
  AFD_CHECK(forms.mla_bufs >= 0 && forms.mla_bufs <= 2,
            "MLA decode tile buffers {}: 0 (chosen), 1 or 2", forms.mla_bufs);
  forms_ = forms;
}

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

std::string CudaBackend::IpcHandle(const Tensor& t) {
  CheckOn("IpcHandle", t, device_);
  AFD_CUDA_CHECK(cudaSetDevice(device_));
  cudaIpcMemHandle_t h;
  const cudaError_t e = cudaIpcGetMemHandle(&h, t.data());
  AFD_CHECK(e == cudaSuccess, "{}: no CUDA IPC handle for {}: {}", name_, t.ToString(),
            cudaGetErrorString(e));
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

void CudaBackend::CopyFromIpc(const Tensor& dst, const std::string& handle, int64_t offset) {
  const OpScope scope(*this, "CopyFromIpc");
  CheckOn("CopyFromIpc", dst, device_);
  AFD_CHECK(handle.size() == sizeof(cudaIpcMemHandle_t), "CopyFromIpc: a handle of {} bytes",
            handle.size());
  auto it = state_->ipc_maps.find(handle);
  if (it == state_->ipc_maps.end()) {
    if (state_->ipc_maps.size() >= State::kMaxIpcMaps) {  // close the least recently used
      auto lru = state_->ipc_maps.begin();
      for (auto m = state_->ipc_maps.begin(); m != state_->ipc_maps.end(); ++m) {
        if (m->second.last_use < lru->second.last_use) lru = m;
      }
      Synchronize();  // no copy from it may still be pending
      cudaIpcCloseMemHandle(lru->second.base);
      state_->ipc_maps.erase(lru);
    }
    AFD_CUDA_CHECK(cudaSetDevice(device_));
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* ptr = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
    AFD_CHECK(e == cudaSuccess,
              "{} cannot open the producer's CUDA IPC memory: {} (the two processes must share "
              "a host and IPC namespace, and GPUs with peer access; use the tcp KV transport "
              "otherwise)",
              name_, cudaGetErrorString(e));
    // The allocation's extent, through the driver (the runtime does not tell it).
    using RangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
    std::string missing;
    void* fn = CudaDriverFunction("cuMemGetAddressRange", &missing);
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult r =
        fn ? reinterpret_cast<RangeFn>(fn)(&base, &size, reinterpret_cast<CUdeviceptr>(ptr))
           : CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS || reinterpret_cast<void*>(base) != ptr) {
      cudaIpcCloseMemHandle(ptr);
      AFD_THROW("{}: cannot tell the extent of the producer's CUDA IPC memory ({})", name_,
                fn ? fmt::format("driver error {}", static_cast<int>(r)) : missing);
    }
    it = state_->ipc_maps.emplace(handle, State::IpcMap{static_cast<char*>(ptr), size, 0}).first;
  }
  it->second.last_use = ++state_->ipc_uses;
  char* const base = it->second.base;
  const size_t size = it->second.size;
  AFD_CHECK(offset >= 0 && static_cast<size_t>(offset) + dst.nbytes() <= size,
            "CopyFromIpc: bytes [{}, {}) past the producer's allocation of {}", offset,
            offset + static_cast<int64_t>(dst.nbytes()), size);
  if (dst.nbytes() == 0) return;
  AFD_CUDA_CHECK(cudaMemcpyAsync(dst.data(), base + offset, dst.nbytes(), cudaMemcpyDeviceToDevice,
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

}  // namespace afd::kernels::cuda

// The CUDA backend: weights, the paged cache and activations in one GPU's memory, every op a
// kernel or a cuBLAS call on one stream (ops enqueue; only CopyToHost and Synchronize wait).
// fp32 weights use fp32 GEMMs (no TF32): the verification mode, within 1e-4 of the CPU
// reference. bf16 weights use bf16 tensor-core GEMMs with fp32 accumulation and output
// (activations rounded to bf16 at the GEMM input, as a bf16 model does).
// CopyToDevice stages through a pinned host ring and does not wait (the ring waits only when
// it wraps), so a step's uploads cost no host sync. Scratch buffers that grow keep the old
// buffer alive (graphs captured earlier still point at it).
// No CUDA include here: the CUDA objects live behind an opaque State.
// Thread safety: one thread at a time (as every Backend).
#pragma once

#include <map>
#include <memory>

#include "afd/kernels/backend.h"

namespace afd::kernels::cuda {

class CudaBackend : public Backend {
 public:
  // Throws afd::Error when the device is missing or unusable.
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  Device device() const override { return Device::Cuda(device_); }
  std::shared_ptr<void> Allocate(size_t bytes) override;
  std::string name() const override { return name_; }
  Stream stream() const override;

  void CopyToDevice(const Tensor& dst, const void* src) override;
  void CopyToHost(void* dst, const Tensor& src) override;
  void Copy(const Tensor& dst, const Tensor& src) override;
  void Fill(const Tensor& dst, float value) override;
  void Synchronize() override;
  int64_t StartCopyToHost(const Tensor& src) override;
  void FinishCopyToHost(int64_t ticket, void* dst) override;
  // A second stream (its own scratch and cuBLAS workspace), forked and joined by events: in a
  // captured graph, parallel branches.
  void Beside(FunctionRef<void()> fn, int64_t rows) override;
  void JoinBeside() override;
  void SetStepRows(int64_t rows) override;
  void WatchWaits(double timeout_s, std::function<void()> check) override;
  void BindThread() override;
  MemoryInfo DeviceMemory() const override;
  bool SupportsIpc() const override { return true; }
  std::string IpcHandle(const Tensor& t) override;
  void CopyFromIpc(const Tensor& dst, const std::string& handle, int64_t offset) override;

  void Embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void Linear(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void Add(const Tensor& y, const Tensor& x) override;
  void AddRmsNorm(const Tensor& y, const Tensor& x, const Tensor& w, float eps,
                  const Tensor& out) override;
  void SiluMul(const Tensor& gate_up, const Tensor& out) override;
  void Rope(const Tensor& x, int64_t offset, const Tensor& positions,
            const RopeSpec& rope) override;
  void GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) override;
  void MlaCacheWrite(const Tensor& ckv, const Tensor& norm_w, float eps,
                     const AttentionTokens& tokens, const RopeSpec& rope,
                     const Tensor& cache) override;
  void MlaAttention(const Tensor& q, const Tensor& kv_b, const AttentionTokens& tokens,
                    const Tensor& cache, int64_t head_begin, int64_t head_end, int64_t dn,
                    int64_t dv, float scale, const Tensor& out) override;
  void GqaCacheWrite(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                     const AttentionTokens& tokens, const RopeSpec& rope, const Tensor& q,
                     const Tensor& cache) override;
  void GqaAttention(const Tensor& q, const AttentionTokens& tokens, const Tensor& cache,
                    int64_t num_kv_heads, int64_t head_begin, int64_t head_end, float scale,
                    const Tensor& out) override;
  void RouterTopk(const Tensor& logits, const Tensor& bias, const RouterSpec& spec,
                  const Tensor& ids, const Tensor& weights) override;
  void RouterGateTopk(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                      const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                      const Tensor& weights) override;
  void RouteAndPermute(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                       const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                       const Tensor& weights, int64_t begin, int64_t num_local,
                       const Tensor& offsets, const Tensor& src_row,
                       const Tensor& row_of_slot) override;
  void MoePermute(const Tensor& ids, int64_t begin, int64_t num_local, const Tensor& offsets,
                  const Tensor& src_row, const Tensor& row_of_slot) override;
  void GroupedExpertMlp(const Tensor& x, const Tensor& offsets, const ExpertWeights& experts,
                        const Tensor& out) override;
  void GatheredExpertMlp(const Tensor& x, const Tensor& src_row, const Tensor& grouped,
                         const Tensor& offsets, const ExpertWeights& experts,
                         const Tensor& out) override;
  void MoeCombineAdd(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                     const Tensor& addend, const Tensor& out) override;
  void MoeCombine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                  bool accumulate, const Tensor& out) override;
  void LogSoftmaxAt(const Tensor& logits, const Tensor& ids, const Tensor& out) override;
  void Sample(const Tensor& logits, const std::vector<SampleRow>& rows, const Tensor& ids) override;
  void TakeIds(const Tensor& from, const Tensor& source, const Tensor& ids) override;
  void AfdDispatch(const Tensor& hidden, const Tensor& ids, const Tensor& weights,
                   int64_t num_experts, const std::vector<Tensor>& rows,
                   const std::vector<Tensor>& scales, const std::vector<Tensor>& tables,
                   const Tensor& send_row, bool shared) override;
  void DequantFp8Rows(const Tensor& q, const Tensor& scales, const Tensor& out) override;
  void AfdSumPartials(const std::vector<Tensor>& partials, const Tensor& send_row,
                      const Tensor& out) override;
  void AfdPairIndex(const Tensor& ids, int64_t num_experts, const Tensor& send_row,
                    const std::vector<Tensor>& row_of_slot, const std::vector<int64_t>& base,
                    const std::vector<int64_t>& shared_base, const Tensor& idx,
                    const Tensor& shared_idx) override;
  void Convert(const Tensor& dst, const Tensor& src) override;

  bool SupportsGraphs() const override { return true; }
  bool SupportsFp8Experts(int64_t hidden, int64_t inter) const override {
    // GroupedMma's e4m3 mma (sm_89+), its K and N.
    return fp8_mma_ && hidden % 32 == 0 && inter % 32 == 0;
  }
  bool RunsAsynchronously() const override { return true; }
  void BeginCapture() override;
  std::unique_ptr<OpGraph> EndCapture() override;
  void AllowTf32(bool on) override { tf32_ = on; }
  void SetFormOverrides(const FormOverrides& forms) override;
  void SetProfiling(bool on, bool profiler_range = true) override;
  std::vector<OpTime> TakeProfile() override;
  void SetKernelTrace(bool on) override;
  std::vector<KernelSpan> TakeKernelTrace() override;
  void BeginTimedSpan() override;
  void EndTimedSpan() override;
  double TakeTimedSeconds() override;

 private:
  struct State;
  class OpScope;  // records an op's device time while profiling
  // Device scratch of at least `bytes` for slot `slot` (grows between uses; kept).
  void* Scratch(int slot, size_t bytes);
  // Scratch that reads zero when (re)allocated: kernels that use it leave it zero again.
  void* ZeroedScratch(int slot, size_t bytes);
  // Device table of an expert set's gate_up (kind 0) or down (kind 1) weight pointers, or of
  // its FP8 block scales (kind 2: gate_up's, kind 3: down's).
  const void* const* ExpertTable(const ExpertWeights& experts, int kind);
  // Copies `bytes` of host memory into the pinned staging ring and returns where (valid until
  // the device copies that read it are done; waits for the device only when the ring is full).
  const void* Stage(const void* src, size_t bytes);
  // Waits until query() (a cudaError_t: event or stream query) is no longer cudaErrorNotReady:
  // block() when no WatchWaits bound is set, else polled with its timeout and check.
  void AwaitDone(FunctionRef<int()> query, FunctionRef<int()> block);
  // Both expert GEMMs on the mma path (bf16 experts whose shapes fit it; else false, nothing
  // launched); rows x[src_row[r]] when src_row is not null.
  bool MmaExpertMlp(const float* x, const int32_t* src_row, int64_t m, int64_t h,
                    const Tensor& offsets, const ExpertWeights& experts, const Tensor& out);

  int device_;
  std::string name_;
  bool tf32_ = false;     // AllowTf32
  bool fp8_mma_ = false;  // the device has the e4m3 mma (compute capability 8.9 or above)
  FormOverrides forms_;   // SetFormOverrides
  std::unique_ptr<State> state_;
};

}  // namespace afd::kernels::cuda

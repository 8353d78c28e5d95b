// The CPU backend: the exact reference every other backend is checked against. Host memory,
// ops run inline on the calling thread (GEMMs on OpenMP threads); every result is
// batch-invariant and the same bits on any x86-64 (gemm.h).
// Thread safety: one thread at a time (as every Backend); Allocate is thread-safe.
#pragma once

#include "afd/kernels/backend.h"

namespace afd::kernels::cpu {

class CpuBackend : public Backend {
 public:
  Device device() const override { return Device::Cpu(); }
  std::shared_ptr<void> Allocate(size_t bytes) override;
  std::string name() const override { return "cpu"; }
  bool SupportsFp8Experts(int64_t, int64_t) const override { return true; }  // dequantized
  Stream stream() const override { return {}; }

  void CopyToDevice(const Tensor& dst, const void* src) override;
  void CopyToHost(void* dst, const Tensor& src) override;
  void Copy(const Tensor& dst, const Tensor& src) override;
  void Fill(const Tensor& dst, float value) override;
  void Synchronize() override {}

  void Embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void Linear(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void Add(const Tensor& y, const Tensor& x) override;
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
  void MoePermute(const Tensor& ids, int64_t begin, int64_t num_local, const Tensor& offsets,
                  const Tensor& src_row, const Tensor& row_of_slot) override;
  void GroupedExpertMlp(const Tensor& x, const Tensor& offsets, const ExpertWeights& experts,
                        const Tensor& out) override;
  void MoeCombine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                  bool accumulate, const Tensor& out) override;
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
  void LogSoftmaxAt(const Tensor& logits, const Tensor& ids, const Tensor& out) override;
  void Sample(const Tensor& logits, const std::vector<SampleRow>& rows, const Tensor& ids) override;
  void TakeIds(const Tensor& from, const Tensor& source, const Tensor& ids) override;
};

}  // namespace afd::kernels::cpu

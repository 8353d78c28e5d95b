#include "afd/kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/kernels/cpu/gemm.h"
#include "afd/kernels/cpu/mla.h"
#include "afd/kernels/cpu/moe.h"
#include "afd/kernels/cpu/ops.h"
#include "afd/kernels/cpu/router.h"
#include "afd/kernels/cpu/sample.h"

namespace afd::kernels::cpu {

namespace {

void CheckHost(const char* op, const Tensor& t) {
  AFD_CHECK(t.empty() || t.device().is_cpu(), "{}: tensor {} is not in host memory", op,
            t.ToString());
  AFD_CHECK(t.is_contiguous(), "{}: tensor {} is not contiguous", op, t.ToString());
}

void CheckMatrix(const char* op, const Tensor& w) {
  CheckHost(op, w);
  AFD_CHECK(w.ndim() == 2 && (w.dtype() == DType::kF32 || w.dtype() == DType::kBF16),
            "{}: weight {} must be a float32 or bfloat16 matrix", op, w.ToString());
}

PagedTokens Paged(const AttentionTokens& t) {
  return {t.positions.data_as<const int64_t>(),
          t.seq_index.data_as<const int32_t>(),
          t.slot_mapping.data_as<const int64_t>(),
          t.block_tables.data_as<const int32_t>(),
          t.block_tables.dim(1),
          t.block_size};
}

RopeParams Params(const RopeSpec& r) {
  return {r.inv_freq.data_as<const float>(), 2 * r.inv_freq.numel(), r.attention_factor,
          r.interleave};
}

void CheckTokens(const char* op, const AttentionTokens& t, int64_t n) {
  t.positions.Expect(op, DType::kI64, {n});
  t.seq_index.Expect(op, DType::kI32, {n});
  t.slot_mapping.Expect(op, DType::kI64, {n});
  t.block_tables.Expect(op, DType::kI32, {-1, -1});
  AFD_CHECK(t.block_size > 0, "{}: block size {}", op, t.block_size);
}

}  // namespace

std::shared_ptr<void> CpuBackend::Allocate(size_t bytes) {
  const size_t size = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, size);
  AFD_CHECK(p != nullptr, "cpu: cannot allocate {} bytes", bytes);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void CpuBackend::CopyToDevice(const Tensor& dst, const void* src) {
  CheckHost("CopyToDevice", dst);
  if (dst.nbytes() > 0) std::memcpy(dst.data(), src, dst.nbytes());
}

void CpuBackend::CopyToHost(void* dst, const Tensor& src) {
  CheckHost("CopyToHost", src);
  if (src.nbytes() > 0) std::memcpy(dst, src.data(), src.nbytes());
}

void CpuBackend::Copy(const Tensor& dst, const Tensor& src) {
  CheckHost("Copy", dst);
  CheckHost("Copy", src);
  AFD_CHECK(dst.nbytes() == src.nbytes() && dst.dtype() == src.dtype(), "Copy: {} from {}",
            dst.ToString(), src.ToString());
  if (dst.nbytes() > 0 && dst.data() != src.data()) {
    std::memmove(dst.data(), src.data(), dst.nbytes());
  }
}

void CpuBackend::Fill(const Tensor& dst, float value) {
  CheckHost("Fill", dst);
  dst.Expect("Fill", DType::kF32, dst.shape());
  std::fill(dst.data_as<float>(), dst.data_as<float>() + dst.numel(), value);
}

void CpuBackend::Embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  CheckMatrix("Embedding", table);
  const int64_t n = ids.numel(), h = table.dim(1);
  ids.Expect("Embedding ids", DType::kI32, {n});
  out.Expect("Embedding out", DType::kF32, {n, h});
  const char* base = static_cast<const char*>(table.data());
  const size_t row_bytes = h * DTypeSize(table.dtype());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids.data_as<const int32_t>()[i];
    AFD_CHECK(id >= 0 && id < table.dim(0), "Embedding: id {} outside [0, {})", id, table.dim(0));
    ConvertToF32(table.dtype(), base + id * row_bytes, h, out.data_as<float>() + i * h);
  }
}

void CpuBackend::Linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  CheckMatrix("Linear", w);
  CheckHost("Linear", x);
  CheckHost("Linear", y);
  const int64_t n = x.dim(0);
  x.Expect("Linear x", DType::kF32, {n, w.dim(1)});
  y.Expect("Linear y", DType::kF32, {n, w.dim(0)});
  Gemm(x.data_as<const float>(), n, w.dim(1), w.data(), w.dtype(), w.dim(0), w.dim(1),
       y.data_as<float>(), w.dim(0));
}

void CpuBackend::RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  const int64_t d = w.numel(), n = x.numel() / std::max<int64_t>(d, 1);
  w.Expect("RmsNorm weight", DType::kF32, {d});
  x.Expect("RmsNorm x", DType::kF32, {n, d});
  out.Expect("RmsNorm out", DType::kF32, {n, d});
  cpu::RmsNorm(x.data_as<const float>(), n, d, w.data_as<const float>(), eps, out.data_as<float>());
}

void CpuBackend::Add(const Tensor& y, const Tensor& x) {
  AFD_CHECK(y.numel() == x.numel() && y.dtype() == DType::kF32 && x.dtype() == DType::kF32,
            "Add: {} += {}", y.ToString(), x.ToString());
  AddInPlace(y.data_as<float>(), x.data_as<const float>(), y.numel());
}

void CpuBackend::SiluMul(const Tensor& gate_up, const Tensor& out) {
  const int64_t n = gate_up.dim(0), inter = gate_up.dim(1) / 2;
  gate_up.Expect("SiluMul gate_up", DType::kF32, {n, 2 * inter});
  out.Expect("SiluMul out", DType::kF32, {n, inter});
  cpu::SiluMul(gate_up.data_as<const float>(), n, inter, out.data_as<float>());
}

void CpuBackend::Rope(const Tensor& x, int64_t offset, const Tensor& positions,
                      const RopeSpec& rope) {
  const int64_t n = x.dim(0), heads = x.dim(1), width = x.dim(2);
  x.Expect("Rope x", DType::kF32, {n, heads, width});
  positions.Expect("Rope positions", DType::kI64, {n});
  const RopeParams p = Params(rope);
  AFD_CHECK(offset >= 0 && offset + p.dim <= width, "Rope: dims [{}, {}) outside width {}", offset,
            offset + p.dim, width);
  for (int64_t i = 0; i < n; ++i) {
    ApplyRope(p, x.data_as<float>() + i * heads * width + offset, heads, width,
              positions.data_as<const int64_t>()[i]);
  }
}

void CpuBackend::GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t m = index.numel(), h = x.dim(1);
  index.Expect("GatherRows index", DType::kI32, {m});
  x.Expect("GatherRows x", DType::kF32, {-1, h});
  out.Expect("GatherRows out", DType::kF32, {-1, h});
  AFD_CHECK(out.dim(0) >= m, "GatherRows: {} rows into {}", m, out.ToString());
  for (int64_t i = 0; i < m; ++i) {
    const int32_t r = index.data_as<const int32_t>()[i];
    AFD_CHECK(r >= 0 && r < x.dim(0), "GatherRows: row {} outside {}", r, x.ToString());
    std::memcpy(out.data_as<float>() + i * h, x.data_as<const float>() + r * h, h * sizeof(float));
  }
}

void CpuBackend::MlaCacheWrite(const Tensor& ckv, const Tensor& norm_w, float eps,
                               const AttentionTokens& tokens, const RopeSpec& rope,
                               const Tensor& cache) {
  const int64_t n = ckv.dim(0), kvr = norm_w.numel(), width = kvr + 2 * rope.inv_freq.numel();
  ckv.Expect("MlaCacheWrite ckv", DType::kF32, {n, width});
  cache.Expect("MlaCacheWrite cache", DType::kF32, {-1, width});
  CheckTokens("MlaCacheWrite", tokens, n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = tokens.slot_mapping.data_as<const int64_t>()[i];
    AFD_CHECK(slot >= 0 && slot < cache.dim(0), "MlaCacheWrite: slot {} outside the cache of {}",
              slot, cache.dim(0));
  }
  cpu::MlaCacheWrite(ckv.data_as<const float>(), n, kvr, norm_w.data_as<const float>(), eps,
                     Paged(tokens), Params(rope), cache.data_as<float>());
}

void CpuBackend::MlaAttention(const Tensor& q, const Tensor& kv_b, const AttentionTokens& tokens,
                              const Tensor& cache, int64_t head_begin, int64_t head_end, int64_t dn,
                              int64_t dv, float scale, const Tensor& out) {
  const int64_t n = q.dim(0), heads = q.dim(1), nh = head_end - head_begin, kvr = kv_b.dim(1);
  const int64_t dr = cache.dim(1) - kvr;
  q.Expect("MlaAttention q", DType::kF32, {n, heads, dn + dr});
  AFD_CHECK(head_end <= heads, "MlaAttention: heads [{}, {}) of {}", head_begin, head_end, heads);
  kv_b.Expect("MlaAttention kv_b", DType::kF32, {-1, kvr});
  AFD_CHECK(head_begin >= 0 && nh > 0 && head_end * (dn + dv) <= kv_b.dim(0),
            "MlaAttention: heads [{}, {}) outside kv_b {}", head_begin, head_end, kv_b.ToString());
  out.Expect("MlaAttention out", DType::kF32, {n, nh * dv});
  CheckTokens("MlaAttention", tokens, n);
  const int64_t slots = cache.dim(0), max_blocks = tokens.block_tables.dim(1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = tokens.positions.data_as<const int64_t>()[i];
    const int32_t seq = tokens.seq_index.data_as<const int32_t>()[i];
    AFD_CHECK(seq >= 0 && seq < tokens.block_tables.dim(0) && pos >= 0 &&
                  pos < max_blocks * tokens.block_size,
              "MlaAttention: token {} (sequence row {}, position {}) outside the block tables {}",
              i, seq, pos, tokens.block_tables.ToString());
    for (int64_t b = 0; b <= pos / tokens.block_size; ++b) {
      const int32_t block = tokens.block_tables.data_as<const int32_t>()[seq * max_blocks + b];
      AFD_CHECK(block >= 0 && (block + 1) * tokens.block_size <= slots,
                "MlaAttention: block {} outside the cache of {} slots", block, slots);
    }
  }
  cpu::MlaAttention(q.data_as<const float>(), n, heads, kv_b.data_as<const float>(), kvr, dn, dr,
                    dv, Paged(tokens), cache.data_as<const float>(), head_begin, head_end, scale,
                    out.data_as<float>());
}

void CpuBackend::RouterTopk(const Tensor& logits, const Tensor& bias, const RouterSpec& spec,
                            const Tensor& ids, const Tensor& weights) {
  const int64_t n = logits.dim(0), e = logits.dim(1), k = spec.top_k;
  logits.Expect("RouterTopk logits", DType::kF32, {n, e});
  if (!bias.empty()) bias.Expect("RouterTopk bias", DType::kF32, {e});
  ids.Expect("RouterTopk ids", DType::kI32, {n, k});
  weights.Expect("RouterTopk weights", DType::kF32, {n, k});
  AFD_CHECK(k >= 1 && k <= e && spec.n_group >= 1 && e % spec.n_group == 0 &&
                spec.topk_group >= 1 && spec.topk_group <= spec.n_group,
            "RouterTopk: top_k {}, n_group {}, topk_group {} for {} experts", k, spec.n_group,
            spec.topk_group, e);
  cpu::RouterTopk(logits.data_as<const float>(), n, e,
                  bias.empty() ? nullptr : bias.data_as<const float>(), spec,
                  ids.data_as<int32_t>(), weights.data_as<float>());
}

void CpuBackend::MoePermute(const Tensor& ids, int64_t begin, int64_t num_local,
                            const Tensor& offsets, const Tensor& src_row,
                            const Tensor& row_of_slot) {
  const int64_t n = ids.dim(0), k = ids.dim(1);
  ids.Expect("MoePermute ids", DType::kI32, {n, k});
  offsets.Expect("MoePermute offsets", DType::kI32, {num_local + 1});
  src_row.Expect("MoePermute src_row", DType::kI32, {n * k});
  row_of_slot.Expect("MoePermute row_of_slot", DType::kI32, {n, k});
  cpu::MoePermute(ids.data_as<const int32_t>(), n, k, begin, num_local, offsets.data_as<int32_t>(),
                  src_row.data_as<int32_t>(), row_of_slot.data_as<int32_t>());
}

void CpuBackend::GroupedExpertMlp(const Tensor& x, const Tensor& offsets,
                                  const ExpertWeights& experts, const Tensor& out) {
  const int64_t h = x.dim(1), e = experts.num_experts();
  offsets.Expect("GroupedExpertMlp offsets", DType::kI32, {e + 1});
  x.Expect("GroupedExpertMlp x", DType::kF32, {-1, h});
  out.Expect("GroupedExpertMlp out", DType::kF32, {x.dim(0), h});
  AFD_CHECK(offsets.data_as<const int32_t>()[e] <= x.dim(0),
            "GroupedExpertMlp: {} grouped rows in {}", offsets.data_as<const int32_t>()[e],
            x.ToString());
  cpu::GroupedExpertMlp(x.data_as<const float>(), h, offsets.data_as<const int32_t>(), experts,
                        out.data_as<float>());
}

void CpuBackend::MoeCombine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                            bool accumulate, const Tensor& out) {
  const int64_t n = row_of_slot.dim(0), k = row_of_slot.dim(1), h = out.dim(1);
  row_of_slot.Expect("MoeCombine row_of_slot", DType::kI32, {n, k});
  weights.Expect("MoeCombine weights", DType::kF32, {n, k});
  y.Expect("MoeCombine y", DType::kF32, {-1, h});
  out.Expect("MoeCombine out", DType::kF32, {n, h});
  for (int64_t s = 0; s < n * k; ++s) {
    AFD_CHECK(row_of_slot.data_as<const int32_t>()[s] < y.dim(0), "MoeCombine: row {} outside {}",
              row_of_slot.data_as<const int32_t>()[s], y.ToString());
  }
  cpu::MoeCombine(y.data_as<const float>(), h, row_of_slot.data_as<const int32_t>(),
                  weights.data_as<const float>(), n, k, accumulate, out.data_as<float>());
}

void CpuBackend::LogSoftmaxAt(const Tensor& logits, const Tensor& ids, const Tensor& out) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  logits.Expect("LogSoftmaxAt logits", DType::kF32, {n, v});
  ids.Expect("LogSoftmaxAt ids", DType::kI32, {n});
  out.Expect("LogSoftmaxAt out", DType::kF32, {n});
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids.data_as<const int32_t>()[i];
    AFD_CHECK(id >= 0 && id < v, "LogSoftmaxAt: id {} outside [0, {})", id, v);
    out.data_as<float>()[i] = LogSoftmaxAtId(logits.data_as<const float>() + i * v, v, id);
  }
}

void CpuBackend::Sample(const Tensor& logits, const std::vector<SampleRow>& rows,
                        const Tensor& ids) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  logits.Expect("Sample logits", DType::kF32, {n, v});
  ids.Expect("Sample ids", DType::kI32, {n});
  AFD_CHECK(static_cast<int64_t>(rows.size()) == n, "Sample: {} rows of parameters for {} logits",
            rows.size(), n);
  for (int64_t i = 0; i < n; ++i) {
    ids.data_as<int32_t>()[i] = SampleRowIds(logits.data_as<const float>() + i * v, v, rows[i]);
  }
}

}  // namespace afd::kernels::cpu

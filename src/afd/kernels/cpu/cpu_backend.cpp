#include "afd/kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/kernels/afd_exchange.h"
#include "afd/kernels/cpu/gemm.h"
#include "afd/kernels/cpu/gqa.h"
#include "afd/kernels/cpu/mla.h"
#include "afd/kernels/cpu/moe.h"
#include "afd/kernels/cpu/ops.h"
#include "afd/kernels/cpu/router.h"
#include "afd/kernels/cpu/sample.h"
#include "afd/kernels/op_checks.h"

namespace afd::kernels::cpu {

namespace {

void CheckHost(const char* op, const Tensor& t) { CheckOnDevice(op, t, Device::Cpu()); }

constexpr Device kCpu{};

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

// Every token's cache slot (negative: none) inside the cache of `slots` rows.
void CheckSlots(const char* op, const AttentionTokens& tokens, int64_t n, int64_t slots) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = tokens.slot_mapping.data_as<const int64_t>()[i];
    AFD_CHECK(slot < slots, "{}: slot {} outside the cache of {}", op, slot, slots);
  }
}

// Every token's sequence row and position inside the block tables, and the blocks of its
// context inside the cache of `slots` rows.
void CheckContext(const char* op, const AttentionTokens& tokens, int64_t n, int64_t slots) {
  const int64_t max_blocks = tokens.block_tables.dim(1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = tokens.positions.data_as<const int64_t>()[i];
    const int32_t seq = tokens.seq_index.data_as<const int32_t>()[i];
    AFD_CHECK(seq >= 0 && seq < tokens.block_tables.dim(0) && pos >= 0 &&
                  pos < max_blocks * tokens.block_size,
              "{}: token {} (sequence row {}, position {}) outside the block tables {}", op, i, seq,
              pos, tokens.block_tables.ToString());
    for (int64_t b = 0; b <= pos / tokens.block_size; ++b) {
      const int32_t block = tokens.block_tables.data_as<const int32_t>()[seq * max_blocks + b];
      AFD_CHECK(block >= 0 && (block + 1) * tokens.block_size <= slots,
                "{}: block {} outside the cache of {} slots", op, block, slots);
    }
  }
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

// Every op: the shared argument checks (op_checks.h), then the checks that read host memory
// (ids, slots, block ids, rows), then the reference kernel.

void CpuBackend::Embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const auto [n, h] = CheckEmbedding(kCpu, table, ids, out);
  const char* base = static_cast<const char*>(table.data());
  const size_t row_bytes = h * DTypeSize(table.dtype());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids.data_as<const int32_t>()[i];
    AFD_CHECK(id >= 0 && id < table.dim(0), "Embedding: id {} outside [0, {})", id, table.dim(0));
    ConvertToF32(table.dtype(), base + id * row_bytes, h, out.data_as<float>() + i * h);
  }
}

void CpuBackend::Linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  const auto [n, k, m] = CheckLinear(kCpu, x, w, y);
  Gemm(x.data_as<const float>(), n, k, w.data(), w.dtype(), m, k, y.data_as<float>(), m);
}

void CpuBackend::RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  const auto [n, d] = CheckRmsNorm(kCpu, x, w, out);
  cpu::RmsNorm(x.data_as<const float>(), n, d, w.data_as<const float>(), eps, out.data_as<float>());
}

void CpuBackend::Add(const Tensor& y, const Tensor& x) {
  CheckAdd(kCpu, y, x);
  AddInPlace(y.data_as<float>(), x.data_as<const float>(), y.numel());
}

void CpuBackend::SiluMul(const Tensor& gate_up, const Tensor& out) {
  const auto [n, inter] = CheckSiluMul(kCpu, gate_up, out);
  cpu::SiluMul(gate_up.data_as<const float>(), n, inter, out.data_as<float>());
}

void CpuBackend::Rope(const Tensor& x, int64_t offset, const Tensor& positions,
                      const RopeSpec& rope) {
  const auto [n, heads, width] = CheckRope(kCpu, x, offset, positions, rope);
  const RopeParams p = Params(rope);
  for (int64_t i = 0; i < n; ++i) {
    ApplyRope(p, x.data_as<float>() + i * heads * width + offset, heads, width,
              positions.data_as<const int64_t>()[i]);
  }
}

void CpuBackend::GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const auto [m, h] = CheckGatherRows(kCpu, x, index, out);
  for (int64_t i = 0; i < m; ++i) {
    const int32_t r = index.data_as<const int32_t>()[i];
    AFD_CHECK(r >= 0 && r < x.dim(0), "GatherRows: row {} outside {}", r, x.ToString());
    std::memcpy(out.data_as<float>() + i * h, x.data_as<const float>() + r * h, h * sizeof(float));
  }
}

void CpuBackend::MlaCacheWrite(const Tensor& ckv, const Tensor& norm_w, float eps,
                               const AttentionTokens& tokens, const RopeSpec& rope,
                               const Tensor& cache) {
  const auto [n, kvr, width] = CheckMlaCacheWrite(kCpu, ckv, norm_w, tokens, rope, cache);
  CheckSlots("MlaCacheWrite", tokens, n, cache.dim(0));
  cpu::MlaCacheWrite(ckv.data_as<const float>(), n, kvr, norm_w.data_as<const float>(), eps,
                     Paged(tokens), Params(rope), cache.data(), cache.dtype() == DType::kBF16);
}

void CpuBackend::MlaAttention(const Tensor& q, const Tensor& kv_b, const AttentionTokens& tokens,
                              const Tensor& cache, int64_t head_begin, int64_t head_end, int64_t dn,
                              int64_t dv, float scale, const Tensor& out) {
  const auto [n, heads, kvr, dr] =
      CheckMlaAttention(kCpu, q, kv_b, tokens, cache, head_begin, head_end, dn, dv, out);
  CheckContext("MlaAttention", tokens, n, cache.dim(0));
  cpu::MlaAttention(q.data_as<const float>(), n, heads, kv_b.data_as<const float>(), kvr, dn, dr,
                    dv, Paged(tokens), cache.data(), cache.dtype() == DType::kBF16, head_begin,
                    head_end, scale, out.data_as<float>());
}

void CpuBackend::GqaCacheWrite(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                               float eps, const AttentionTokens& tokens, const RopeSpec& rope,
                               const Tensor& q, const Tensor& cache) {
  const auto [n, heads, kvh, d] =
      CheckGqaCacheWrite(kCpu, qkv, q_norm, k_norm, tokens, rope, q, cache);
  CheckSlots("GqaCacheWrite", tokens, n, cache.dim(0));
  cpu::GqaCacheWrite(qkv.data_as<const float>(), n, heads, kvh, d, q_norm.data_as<const float>(),
                     k_norm.data_as<const float>(), eps, Paged(tokens), Params(rope),
                     q.data_as<float>(), cache.data(), cache.dtype() == DType::kBF16);
}

void CpuBackend::GqaAttention(const Tensor& q, const AttentionTokens& tokens, const Tensor& cache,
                              int64_t num_kv_heads, int64_t head_begin, int64_t head_end,
                              float scale, const Tensor& out) {
  const auto [n, heads, kvh, d] =
      CheckGqaAttention(kCpu, q, tokens, cache, num_kv_heads, head_begin, head_end, out);
  CheckContext("GqaAttention", tokens, n, cache.dim(0));
  cpu::GqaAttention(q.data_as<const float>(), n, heads, kvh, d, Paged(tokens), cache.data(),
                    cache.dtype() == DType::kBF16, head_begin, head_end, scale,
                    out.data_as<float>());
}

void CpuBackend::RouterTopk(const Tensor& logits, const Tensor& bias, const RouterSpec& spec,
                            const Tensor& ids, const Tensor& weights) {
  const auto [n, e] = CheckRouterTopk(kCpu, logits, bias, spec, ids, weights);
  cpu::RouterTopk(logits.data_as<const float>(), n, e,
                  bias.empty() ? nullptr : bias.data_as<const float>(), spec,
                  ids.data_as<int32_t>(), weights.data_as<float>());
}

void CpuBackend::MoePermute(const Tensor& ids, int64_t begin, int64_t num_local,
                            const Tensor& offsets, const Tensor& src_row,
                            const Tensor& row_of_slot) {
  const auto [n, k] = CheckMoePermute(kCpu, ids, num_local, offsets, src_row, row_of_slot);
  cpu::MoePermute(ids.data_as<const int32_t>(), n, k, begin, num_local, offsets.data_as<int32_t>(),
                  src_row.data_as<int32_t>(), row_of_slot.data_as<int32_t>());
}

void CpuBackend::GroupedExpertMlp(const Tensor& x, const Tensor& offsets,
                                  const ExpertWeights& experts, const Tensor& out) {
  const auto [m, h] = CheckGroupedExpertMlp(kCpu, x, offsets, experts, out);
  const int64_t e = experts.num_experts();
  AFD_CHECK(offsets.data_as<const int32_t>()[e] <= m, "GroupedExpertMlp: {} grouped rows in {}",
            offsets.data_as<const int32_t>()[e], x.ToString());
  cpu::GroupedExpertMlp(x.data_as<const float>(), h, offsets.data_as<const int32_t>(), experts,
                        out.data_as<float>());
}

void CpuBackend::MoeCombine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                            bool accumulate, const Tensor& out) {
  const auto [n, k, h] = CheckMoeCombine(kCpu, y, row_of_slot, weights, out);
  for (int64_t s = 0; s < n * k; ++s) {
    AFD_CHECK(row_of_slot.data_as<const int32_t>()[s] < y.dim(0), "MoeCombine: row {} outside {}",
              row_of_slot.data_as<const int32_t>()[s], y.ToString());
  }
  cpu::MoeCombine(y.data_as<const float>(), h, row_of_slot.data_as<const int32_t>(),
                  weights.data_as<const float>(), n, k, accumulate, out.data_as<float>());
}

void CpuBackend::LogSoftmaxAt(const Tensor& logits, const Tensor& ids, const Tensor& out) {
  const auto [n, v] = CheckLogSoftmaxAt(kCpu, logits, ids, out);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids.data_as<const int32_t>()[i];
    AFD_CHECK(id >= 0 && id < v, "LogSoftmaxAt: id {} outside [0, {})", id, v);
    out.data_as<float>()[i] = LogSoftmaxAtId(logits.data_as<const float>() + i * v, v, id);
  }
}

void CpuBackend::Sample(const Tensor& logits, const std::vector<SampleRow>& rows,
                        const Tensor& ids) {
  const auto [n, v] = CheckSample(kCpu, logits, rows, ids);
  for (int64_t i = 0; i < n; ++i) {
    ids.data_as<int32_t>()[i] = SampleRowIds(logits.data_as<const float>() + i * v, v, rows[i]);
  }
}

void CpuBackend::TakeIds(const Tensor& from, const Tensor& source, const Tensor& ids) {
  const int64_t n = CheckTakeIds(kCpu, from, source, ids), k = from.numel();
  for (int64_t t = 0; t < n; ++t) {
    const int32_t s = source.data_as<const int32_t>()[t];
    if (s < 0) continue;
    AFD_CHECK(s < k, "TakeIds: source {} of token {} outside the {} ids", s, t, k);
    ids.data_as<int32_t>()[t] = from.data_as<const int32_t>()[s];
  }
}

namespace {

// One row of the FP8 dispatch (kernels/afd_exchange.h): groups of kAfdFp8Group elements, each
// with its clamped amax (NaN elements ignored, as CUDA's fmaxf does).
void QuantizeFp8Row(const float* x, int64_t h, uint8_t* q, float* scales) {
  for (int64_t g = 0; g < AfdFp8Groups(h); ++g) {
    const int64_t begin = g * kAfdFp8Group, end = std::min(h, begin + kAfdFp8Group);
    float amax = 0.0f;
    for (int64_t c = begin; c < end; ++c) amax = std::fmax(amax, std::fabs(x[c]));
    const float a = AfdFp8Clamp(amax), mul = AfdFp8Mul(a);
    for (int64_t c = begin; c < end; ++c) q[c] = F32ToFp8E4M3(x[c] * mul);
    scales[g] = AfdFp8Scale(a);
  }
}

}  // namespace

void CpuBackend::AfdDispatch(const Tensor& hidden, const Tensor& ids, const Tensor& weights,
                             int64_t num_experts, const std::vector<Tensor>& rows,
                             const std::vector<Tensor>& scales, const std::vector<Tensor>& tables,
                             const Tensor& send_row, bool shared) {
  const AfdShape s =
      CheckAfdDispatch(kCpu, hidden, ids, weights, num_experts, rows, scales, tables, send_row);
  const int64_t n = s.n, k = s.k, h = s.h;
  const int F = s.ranks;
  const auto* id = ids.data_as<const int32_t>();
  const auto* w = weights.data_as<const int32_t>();  // the f32 bits
  const auto* x = hidden.data_as<const float>();
  auto* sr = send_row.data_as<int32_t>();
  for (int64_t i = 0; i < n * k; ++i) {
    AFD_CHECK(id[i] >= 0 && id[i] < num_experts, "AfdDispatch: token {} has expert id {} of {}",
              i / k, id[i], num_experts);
  }
  for (int f = 0; f < F; ++f) {
    const int64_t owned = shared ? AfdOwnedTokens(n, F, f) : 0;
    int64_t next = owned;  // rows [owned, ...) are the other tokens with an expert here
    auto* table = tables[f].data_as<int32_t>();
    for (int64_t t = 0; t < n; ++t) {
      bool here = false;
      for (int64_t j = 0; j < k && !here; ++j)
        here = ExpertOwner(id[t * k + j], num_experts, F) == f;
      int64_t r = -1;
      if (shared && t % F == f) {
        r = t / F;
      } else if (here) {
        r = next++;
      }
      sr[t * F + f] = static_cast<int32_t>(r);
      if (r < 0) continue;
      std::memcpy(table + r * k, id + t * k, 4 * k);
      std::memcpy(table + n * k + r * k, w + t * k, 4 * k);
      if (rows[f].dtype() == DType::kF32) {
        std::memcpy(rows[f].data_as<float>() + r * h, x + t * h, 4 * h);
      } else if (rows[f].dtype() == DType::kF8E4M3) {
        QuantizeFp8Row(x + t * h, h, rows[f].data_as<uint8_t>() + r * h,
                       scales[f].data_as<float>() + r * AfdFp8Groups(h));
      } else {
        uint16_t* dst = rows[f].data_as<uint16_t>() + r * h;
        for (int64_t c = 0; c < h; ++c) dst[c] = F32ToBf16(x[t * h + c]);
      }
    }
    for (int64_t r = next; r < n; ++r) std::fill(table + r * k, table + (r + 1) * k, -1);
  }
}

void CpuBackend::DequantFp8Rows(const Tensor& q, const Tensor& scales, const Tensor& out) {
  const RowsShape r = CheckDequantFp8Rows(kCpu, q, scales, out);
  const int64_t groups = AfdFp8Groups(r.d);
  const auto* in = q.data_as<const uint8_t>();
  const auto* sc = scales.data_as<const float>();
  float* o = out.data_as<float>();
  for (int64_t i = 0; i < r.n; ++i) {
    for (int64_t c = 0; c < r.d; ++c) {
      o[i * r.d + c] = Fp8E4M3ToF32(in[i * r.d + c]) * sc[i * groups + c / kAfdFp8Group];
    }
  }
}

void CpuBackend::AfdSumPartials(const std::vector<Tensor>& partials, const Tensor& send_row,
                                const Tensor& out) {
  const AfdShape s = CheckAfdSumPartials(kCpu, partials, send_row, out);
  const auto* sr = send_row.data_as<const int32_t>();
  float* o = out.data_as<float>();
  for (int64_t t = 0; t < s.n; ++t) {
    bool first = true;
    for (int f = 0; f < s.ranks; ++f) {
      const int32_t r = sr[t * s.ranks + f];
      if (r < 0) continue;
      AFD_CHECK(r < partials[f].dim(0), "AfdSumPartials: row {} of rank {} outside {}", r, f,
                partials[f].ToString());
      const float* y = partials[f].data_as<const float>() + r * s.h;
      for (int64_t c = 0; c < s.h; ++c) o[t * s.h + c] = first ? y[c] : o[t * s.h + c] + y[c];
      first = false;
    }
    AFD_CHECK(!first, "AfdSumPartials: token {} was sent to no FFN rank", t);
  }
}

void CpuBackend::AfdPairIndex(const Tensor& ids, int64_t num_experts, const Tensor& send_row,
                              const std::vector<Tensor>& row_of_slot,
                              const std::vector<int64_t>& base,
                              const std::vector<int64_t>& shared_base, const Tensor& idx,
                              const Tensor& shared_idx) {
  const AfdShape s = CheckAfdPairIndex(kCpu, ids, num_experts, send_row, row_of_slot, base,
                                       shared_base, idx, shared_idx);
  const int64_t n = s.n, k = s.k;
  const int F = s.ranks;
  const auto* id = ids.data_as<const int32_t>();
  const auto* sr = send_row.data_as<const int32_t>();
  auto* out = idx.data_as<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int f = ExpertOwner(id[t * k + j], num_experts, F);
      const int32_t r = sr[t * F + f];
      AFD_CHECK(r >= 0,
                "AfdPairIndex: token {} was not sent to FFN rank {}, which owns its "
                "expert {}",
                t, f, id[t * k + j]);
      const int32_t g = row_of_slot[f].data_as<const int32_t>()[r * k + j];
      AFD_CHECK(g >= 0, "AfdPairIndex: FFN rank {} grouped no row for token {} slot {}", f, t, j);
      out[t * k + j] = static_cast<int32_t>(base[f] + g);
    }
    if (!shared_idx.empty()) {
      shared_idx.data_as<int32_t>()[t] = static_cast<int32_t>(shared_base[t % F] + t / F);
    }
  }
}

void CpuBackend::Convert(const Tensor& dst, const Tensor& src) {
  const int64_t n = CheckConvert(kCpu, dst, src);
  if (dst.dtype() == src.dtype()) {
    Copy(dst, src);
  } else if (dst.dtype() == DType::kF32) {
    const auto* in = src.data_as<const uint16_t>();
    float* o = dst.data_as<float>();
    for (int64_t i = 0; i < n; ++i) o[i] = Bf16ToF32(in[i]);
  } else {
    const auto* in = src.data_as<const float>();
    auto* o = dst.data_as<uint16_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = F32ToBf16(in[i]);
  }
}

}  // namespace afd::kernels::cpu

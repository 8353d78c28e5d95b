#include "afd/kernels/cpu/moe.h"

#include <algorithm>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/kernels/cpu/gemm.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::kernels::cpu {

void MoePermute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t num_local,
                int32_t* offsets, int32_t* src_row, int32_t* row_of_slot) {
  std::fill(offsets, offsets + num_local + 1, 0);
  std::fill(src_row, src_row + n * k, 0);
  for (int64_t s = 0; s < n * k; ++s) {
    const int64_t e = ids[s] - begin;
    if (e >= 0 && e < num_local) ++offsets[e + 1];
  }
  for (int64_t e = 0; e < num_local; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> next(offsets, offsets + num_local);
  for (int64_t s = 0; s < n * k; ++s) {  // tokens ascending within each expert
    const int64_t e = ids[s] - begin;
    if (e >= 0 && e < num_local) {
      const int32_t r = next[e]++;
      src_row[r] = static_cast<int32_t>(s / k);
      row_of_slot[s] = r;
    } else {
      row_of_slot[s] = -1;
    }
  }
}

void SwiGluMlp(const float* x, int64_t n, int64_t hidden, const Tensor& gate_up, const Tensor& down,
               float* out) {
  const int64_t inter = down.dim(1);
  thread_local std::vector<float> gu, act;
  gu.resize(n * 2 * inter);  // [n, 2I]
  act.resize(n * inter);     // [n, I]
  Gemm(x, n, hidden, gate_up.data(), gate_up.dtype(), 2 * inter, hidden, gu.data(), 2 * inter);
  SiluMul(gu.data(), n, inter, act.data());
  Gemm(act.data(), n, inter, down.data(), down.dtype(), hidden, inter, out, hidden);
}

namespace {

// An FP8 weight [rows, cols] as fp32: code * scale of its block (ExpertWeights), in fp32 --
// the values a dequantizing load holds, so the results are the same bits.
void DequantFp8Weight(const Tensor& codes, const Tensor& scales, int64_t split,
                      std::vector<float>& out) {
  const int64_t rows = codes.dim(0), cols = codes.dim(1), sc = scales.dim(1);
  const auto* q = codes.data_as<const uint8_t>();
  const float* s = scales.data_as<const float>();
  // Rows from `split` on start a new run of block rows (gate_up: up_proj's rows).
  const int64_t split_blocks = (split + kFp8WeightBlock - 1) / kFp8WeightBlock;
  out.resize(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t block_row =
        i < split ? i / kFp8WeightBlock : split_blocks + (i - split) / kFp8WeightBlock;
    const float* srow = s + block_row * sc;
    for (int64_t j = 0; j < cols; ++j) {
      out[i * cols + j] = Fp8E4M3ToF32(q[i * cols + j]) * srow[j / kFp8WeightBlock];
    }
  }
}

}  // namespace

void GroupedExpertMlp(const float* x, int64_t hidden, const int32_t* offsets,
                      const ExpertWeights& experts, float* out) {
  thread_local std::vector<float> gate_up, down;
  for (int64_t e = 0; e < experts.num_experts(); ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    AFD_CHECK(!experts.gate_up[e].empty(), "routed expert {} is not loaded in this process",
              experts.expert_begin + e);
    if (!experts.fp8()) {
      SwiGluMlp(x + r0 * hidden, rows, hidden, experts.gate_up[e], experts.down[e],
                out + r0 * hidden);
      continue;
    }
    const int64_t inter = experts.down[e].dim(1);
    DequantFp8Weight(experts.gate_up[e], experts.gate_up_scale[e], inter, gate_up);
    DequantFp8Weight(experts.down[e], experts.down_scale[e], hidden, down);
    SwiGluMlp(x + r0 * hidden, rows, hidden,
              Tensor(gate_up.data(), DType::kF32, {2 * inter, hidden}, Device::Cpu()),
              Tensor(down.data(), DType::kF32, {hidden, inter}, Device::Cpu()), out + r0 * hidden);
  }
}

void MoeCombine(const float* y, int64_t hidden, const int32_t* row_of_slot, const float* weights,
                int64_t n, int64_t k, bool accumulate, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * hidden;
    if (!accumulate) std::fill(o, o + hidden, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of_slot[t * k + j];
      if (r < 0) continue;
      const float* yr = y + static_cast<int64_t>(r) * hidden;
      const float wt = weights[t * k + j];
      for (int64_t i = 0; i < hidden; ++i) o[i] += yr[i] * wt;
    }
  }
}

}  // namespace afd::kernels::cpu

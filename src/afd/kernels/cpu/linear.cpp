#include "afd/kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "afd/common/error.h"

namespace afd::kernels {

namespace {

// y_block[kLinearRowBlock, n_out] = x_block[kLinearRowBlock, k] · w[n_out, k]ᵀ, with leading
// dimension ldy for y. Always the same sgemm shape for the same (n_out, k).
void GemmBlock(const float* x_block, const float* w, int64_t n_out, int64_t k, float* y,
               int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kLinearRowBlock, n_out, k, 1.0f, x_block, k,
              w, k, 0.0f, y, ldy);
}

// y[n, n_out] (leading dimension ldy) = x[n, k] · w[n_out, k]ᵀ, by row blocks.
void GemmRows(const float* x, int64_t n, const float* w, int64_t n_out, int64_t k, float* y,
              int64_t ldy) {
  thread_local std::vector<float> x_pad, y_pad;
  for (int64_t r0 = 0; r0 < n; r0 += kLinearRowBlock) {
    const int64_t rows = std::min(kLinearRowBlock, n - r0);
    if (rows == kLinearRowBlock) {
      GemmBlock(x + r0 * k, w, n_out, k, y + r0 * ldy, ldy);
      continue;
    }
    x_pad.assign(kLinearRowBlock * k, 0.0f);  // x_pad: [kLinearRowBlock, k]
    std::memcpy(x_pad.data(), x + r0 * k, rows * k * sizeof(float));
    y_pad.resize(kLinearRowBlock * n_out);  // y_pad: [kLinearRowBlock, n_out]
    GemmBlock(x_pad.data(), w, n_out, k, y_pad.data(), n_out);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(y + (r0 + r) * ldy, y_pad.data() + r * n_out, n_out * sizeof(float));
    }
  }
}

}  // namespace

void Linear(const float* x, int64_t n, const Matrix& w, float* y) {
  AFD_CHECK(!w.empty(), "Linear: empty weight");
  if (n == 0) return;
  const int64_t k = w.cols();
  const int64_t n_out = w.rows();
  if (w.dtype() == DType::kF32) {
    GemmRows(x, n, w.f32(), n_out, k, y, n_out);
    return;
  }
  thread_local std::vector<float> panel;  // [kLinearColBlock, k] fp32 copy of some rows of w
  panel.resize(kLinearColBlock * k);
  for (int64_t c0 = 0; c0 < n_out; c0 += kLinearColBlock) {
    const int64_t cols = std::min(kLinearColBlock, n_out - c0);
    w.RowsToF32(c0, cols, panel.data());
    GemmRows(x, n, panel.data(), cols, k, y + c0, n_out);
  }
}

void LinearReference(const float* x, int64_t n, const Matrix& w, float* y) {
  const int64_t k = w.cols();
  std::vector<float> row(k);
  for (int64_t o = 0; o < w.rows(); ++o) {
    w.RowsToF32(o, 1, row.data());
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0.0;
      for (int64_t j = 0; j < k; ++j) acc += static_cast<double>(x[i * k + j]) * row[j];
      y[i * w.rows() + o] = static_cast<float>(acc);
    }
  }
}

}  // namespace afd::kernels

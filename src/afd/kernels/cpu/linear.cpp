#include "afd/kernels/cpu/linear.h"

#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/gemm.h"

namespace afd::kernels {

void Linear(const float* x, int64_t n, const Matrix& w, float* y) {
  AFD_CHECK(!w.empty(), "Linear: empty weight");
  Gemm(x, n, w.cols(), w, y, w.rows());
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

// Linear (OpenBLAS) against the double-accumulating reference, and its batch invariance: a row's
// output must be bit-identical whatever the batch size and the row's place in the batch.
#include "afd/kernels/cpu/linear.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace afd::kernels {
namespace {

std::vector<float> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

Matrix RandomMatrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  Matrix m = Matrix::Allocate(dtype, rows, cols);
  const std::vector<float> v = RandomVector(rows * cols, seed);
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (dtype == DType::kF32) {
      static_cast<float*>(m.mutable_data())[i] = v[i];
    } else {
      static_cast<uint16_t*>(m.mutable_data())[i] = F32ToBf16(v[i]);
    }
  }
  return m;
}

double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

class LinearTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTest, MatchesReference) {
  // Shapes that are not multiples of the row/column blocks.
  for (auto [n, out, in] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 7, 5}, {37, 300, 96}, {16, 513, 64}}) {
    const Matrix w = RandomMatrix(GetParam(), out, in, 1);
    const std::vector<float> x = RandomVector(n * in, 2);
    std::vector<float> y(n * out), ref(n * out);
    Linear(x.data(), n, w, y.data());
    LinearReference(x.data(), n, w, ref.data());
    EXPECT_LT(RelError(y, ref), 1e-6) << n << "x" << in << " -> " << out;
  }
}

TEST_P(LinearTest, BatchInvariant) {
  const int64_t n = 41, in = 160, out = 520;
  const Matrix w = RandomMatrix(GetParam(), out, in, 3);
  const std::vector<float> x = RandomVector(n * in, 4);
  for (int threads : {1, 2}) {
    openblas_set_num_threads(threads);
    std::vector<float> full(n * out);
    Linear(x.data(), n, w, full.data());
    // Each row alone, and a batch starting at an odd offset, must give the same bits.
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> one(out);
      Linear(x.data() + r * in, 1, w, one.data());
      ASSERT_EQ(0, std::memcmp(one.data(), full.data() + r * out, out * sizeof(float)))
          << "row " << r << " threads " << threads;
    }
    std::vector<float> part((n - 3) * out);
    Linear(x.data() + 3 * in, n - 3, w, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), full.data() + 3 * out, part.size() * sizeof(float)));
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, LinearTest, ::testing::Values(DType::kF32, DType::kBF16));

TEST(DType, Conversions) {
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3f80);  // halfway: round to even
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
}

}  // namespace
}  // namespace afd::kernels

// Linear against the double-accumulating reference, and its exactness by construction: a row's
// output must be bit-identical whatever the batch size, the row's place in the batch, the
// thread count and the micro-kernel (AVX-512, AVX2+FMA, portable) -- and equal to the fma chain
// gemm.h defines, computed here the slow obvious way.
#include "afd/kernels/cpu/gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "afd/common/dtype_convert.h"

namespace afd::kernels::cpu {
namespace {

std::vector<float> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// A weight matrix [rows, cols] of `dtype`.
struct Weights {
  DType dtype;
  int64_t rows, cols;
  std::vector<char> bytes;
  const void* data() const { return bytes.data(); }
};

Weights RandomMatrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  Weights m{dtype, rows, cols, std::vector<char>(rows * cols * DTypeSize(dtype))};
  const std::vector<float> v = RandomVector(rows * cols, seed);
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (dtype == DType::kF32) {
      reinterpret_cast<float*>(m.bytes.data())[i] = v[i];
    } else {
      reinterpret_cast<uint16_t*>(m.bytes.data())[i] = F32ToBf16(v[i]);
    }
  }
  return m;
}

void Linear(const float* x, int64_t n, const Weights& w, float* y) {
  Gemm(x, n, w.cols, w.data(), w.dtype, w.rows, w.cols, y, w.rows);
}

void LinearReference(const float* x, int64_t n, const Weights& w, float* y) {
  GemmReference(x, n, w.data(), w.dtype, w.rows, w.cols, y);
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
    const Weights w = RandomMatrix(GetParam(), out, in, 1);
    const std::vector<float> x = RandomVector(n * in, 2);
    std::vector<float> y(n * out), ref(n * out);
    Linear(x.data(), n, w, y.data());
    LinearReference(x.data(), n, w, ref.data());
    EXPECT_LT(RelError(y, ref), 1e-6) << n << "x" << in << " -> " << out;
  }
}

TEST_P(LinearTest, BatchInvariant) {
  const int64_t n = 41, in = 160, out = 520;
  const Weights w = RandomMatrix(GetParam(), out, in, 3);
  const std::vector<float> x = RandomVector(n * in, 4);
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
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

// The fma chain of gemm.h, one element at a time.
float ChainElement(const float* x, const Weights& w, int64_t o) {
  std::vector<float> row(w.cols);
  ConvertToF32(w.dtype, w.bytes.data() + o * w.cols * DTypeSize(w.dtype), w.cols, row.data());
  float acc = 0.0f;
  for (int64_t j = 0; j < w.cols; ++j) acc = std::fma(x[j], row[j], acc);
  return acc;
}

TEST_P(LinearTest, EveryKernelIsTheDefinedChain) {
  // k spans several k chunks (partial sums pass through y) and ends off a chunk boundary;
  // n_out leaves a partial panel; n covers every tile height of every kernel.
  const int64_t n = 29, in = 600, out = 37;
  const Weights w = RandomMatrix(GetParam(), out, in, 5);
  const std::vector<float> x = RandomVector(n * in, 6);
  std::vector<float> chain(n * out);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) chain[i * out + o] = ChainElement(&x[i * in], w, o);
  }
  for (GemmIsa isa : {GemmIsa::kPortable, GemmIsa::kAvx2, GemmIsa::kAvx512}) {
    if (isa == GemmIsa::kAvx512 && BestGemmIsa() != GemmIsa::kAvx512) continue;
    if (isa == GemmIsa::kAvx2 && BestGemmIsa() == GemmIsa::kPortable) continue;
    // y has a wider stride than n_out: columns past it must stay untouched.
    const int64_t ldy = out + 3;
    std::vector<float> y(n * ldy, -7.0f);
    Gemm(x.data(), n, in, w.data(), w.dtype, out, in, y.data(), ldy, isa);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(0, std::memcmp(&y[i * ldy], &chain[i * out], out * sizeof(float)))
          << GemmIsaName(isa) << " row " << i;
      for (int64_t o = out; o < ldy; ++o) ASSERT_EQ(y[i * ldy + o], -7.0f);
    }
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
}  // namespace afd::kernels::cpu

#include "afd/kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace afd::kernels::cpu {
namespace {

TEST(Ops, RmsNorm) {
  const std::vector<float> x = {1, 2, 3, 4, -1, 0, 0, 1};  // [2, 4]
  const std::vector<float> w = {1, 2, 1, 0.5};
  std::vector<float> out(8);
  RmsNorm(x.data(), 2, 4, w.data(), 1e-6f, out.data());
  const float inv0 = 1.0f / std::sqrt(30.0f / 4 + 1e-6f);
  EXPECT_FLOAT_EQ(out[1], 2 * 2 * inv0);
  EXPECT_FLOAT_EQ(out[3], 0.5f * 4 * inv0);
  const float inv1 = 1.0f / std::sqrt(2.0f / 4 + 1e-6f);
  EXPECT_FLOAT_EQ(out[4], -inv1);
}

TEST(Ops, SiluMulSoftmaxArgmax) {
  const std::vector<float> gu = {1.0f, -2.0f, 3.0f, 0.5f};  // [1, 2·2]: gate {1,-2}, up {3,.5}
  std::vector<float> out(2);
  SiluMul(gu.data(), 1, 2, out.data());
  EXPECT_FLOAT_EQ(out[0], 3.0f / (1.0f + std::exp(-1.0f)));
  EXPECT_FLOAT_EQ(out[1], 0.5f * -2.0f / (1.0f + std::exp(2.0f)));

  std::vector<float> s = {1000.0f, 1000.0f, -1e30f};
  SoftmaxInPlace(s.data(), 3);
  EXPECT_FLOAT_EQ(s[0], 0.5f);
  EXPECT_FLOAT_EQ(s[2], 0.0f);

  std::vector<float> l = {0.0f, std::log(3.0f)};
  LogSoftmax(l.data(), 2, l.data());
  EXPECT_NEAR(l[0], std::log(0.25f), 1e-6);
  EXPECT_NEAR(l[1], std::log(0.75f), 1e-6);

  const std::vector<float> a = {1, 5, 5, 2};
  EXPECT_EQ(ArgMax(a.data(), 4), 1);
}

}  // namespace
}  // namespace afd::kernels::cpu

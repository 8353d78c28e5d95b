#include "afd/kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"

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

  const std::vector<float> a = {1, 5, 5, 2};
  EXPECT_EQ(ArgMax(a.data(), 4), 1);
}

// FP8 experts (ExpertWeights::fp8) whose codes or scales do not match are refused naming the
// expert and the tensor; codes without scales are refused too (never read as another dtype).
TEST(Ops, Fp8ExpertsOfTheWrongShapeAreRefused) {
  CpuBackend cpu;
  const int64_t h = 32, inter = 16;
  std::vector<uint8_t> gu(2 * inter * h), dn(h * inter);
  std::vector<float> gus(2 * 1), dns(1), x(2 * h, 0.5f), out(2 * h);
  std::vector<int32_t> offsets = {0, 2};
  ExpertWeights e;
  e.expert_begin = 5;
  e.gate_up = {Tensor(gu.data(), DType::kF8E4M3, {2 * inter, h}, Device::Cpu())};
  e.down = {Tensor(dn.data(), DType::kF8E4M3, {h, inter}, Device::Cpu())};
  const Tensor tx(x.data(), DType::kF32, {2, h}, Device::Cpu());
  const Tensor toff(offsets.data(), DType::kI32, {2}, Device::Cpu());
  const Tensor tout(out.data(), DType::kF32, {2, h}, Device::Cpu());
  const auto refused = [&](const std::string& words) {
    try {
      cpu.GroupedExpertMlp(tx, toff, e, tout);
      ADD_FAILURE() << "no error; expected: " << words;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(words), std::string::npos) << err.what();
    }
  };
  refused("expert 5 holds FP8 codes without their block scales");
  e.gate_up_scale = {Tensor(gus.data(), DType::kF32, {2, 1}, Device::Cpu())};
  e.down_scale = {Tensor(dns.data(), DType::kF32, {1, 2}, Device::Cpu())};  // should be [1, 1]
  refused("GroupedExpertMlp expert 5 down scales");
  e.down_scale = {Tensor(dns.data(), DType::kF32, {1, 1}, Device::Cpu())};
  cpu.GroupedExpertMlp(tx, toff, e, tout);  // codes 0: zeros out
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace afd::kernels::cpu

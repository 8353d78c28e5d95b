// The AFD exchange ops on the CPU reference (kernels/backend.h, "AFD exchange"): the dispatch
// layout (each token once per FFN rank that needs it, owned tokens first), the sum of partials,
// the per-pair index, f32 <-> bf16 and the FP8 rows. The GPU kernels are checked against the
// monolithic run on the device (tools/device/afd_exchange_check.sh).
#include "afd/kernels/afd_exchange.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"

namespace afd::kernels {
namespace {

// The owner rule itself is topology/expert_range.h's (tests/topology/expert_range_test.cpp).
TEST(AfdExchange, OwnedTokensAreEveryFthFromF) {
  EXPECT_EQ(AfdOwnedTokens(7, 3, 0), 3);
  EXPECT_EQ(AfdOwnedTokens(7, 3, 2), 2);
  EXPECT_EQ(AfdOwnedTokens(1, 3, 2), 0);
}

TEST(AfdExchange, DispatchSendsEachTokenOncePerRankOwnedTokensFirst) {
  cpu::CpuBackend b;
  const int64_t n = 7, k = 2, h = 3, E = 6;
  const int F = 3;  // experts [0,2) [2,4) [4,6)
  std::vector<int32_t> ids = {0, 1, 2, 5, 4, 5, 0, 3, 1, 4, 2, 3, 0, 5};
  std::vector<float> w(n * k), x(n * h);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f + static_cast<float>(i);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i) / 4;
  for (bool shared : {true, false}) {
    std::vector<std::vector<float>> rows(F, std::vector<float>(n * h, -7.0f));
    std::vector<std::vector<int32_t>> tables(F, std::vector<int32_t>(2 * n * k, 99));
    std::vector<int32_t> send_row(n * F, 42);
    std::vector<Tensor> rt, tt;
    for (int f = 0; f < F; ++f) {
      rt.emplace_back(rows[f].data(), DType::kF32, std::vector<int64_t>{n, h});
      tt.emplace_back(tables[f].data(), DType::kI32, std::vector<int64_t>{2 * n * k});
    }
    b.AfdDispatch(Tensor(x.data(), DType::kF32, {n, h}), Tensor(ids.data(), DType::kI32, {n, k}),
                  Tensor(w.data(), DType::kF32, {n, k}), E, rt, {}, tt,
                  Tensor(send_row.data(), DType::kI32, {n, F}), shared);
    for (int f = 0; f < F; ++f) {
      // Expected order: owned tokens (t % F == f, with shared experts), then the others that
      // have an expert on f, ascending.
      std::vector<int64_t> order;
      if (shared) {
        for (int64_t t = f; t < n; t += F) order.push_back(t);
      }
      for (int64_t t = 0; t < n; ++t) {
        if (shared && t % F == f) continue;
        if (ExpertOwner(ids[t * k], E, F) == f || ExpertOwner(ids[t * k + 1], E, F) == f) {
          order.push_back(t);
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        const auto it = std::find(order.begin(), order.end(), t);
        EXPECT_EQ(send_row[t * F + f], it == order.end() ? -1 : it - order.begin())
            << "token " << t << " rank " << f << " shared " << shared;
      }
      for (size_t r = 0; r < order.size(); ++r) {
        const int64_t t = order[r];
        for (int64_t c = 0; c < h; ++c) EXPECT_EQ(rows[f][r * h + c], x[t * h + c]);
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(tables[f][r * k + j], ids[t * k + j]);
          EXPECT_EQ(tables[f][n * k + r * k + j], reinterpret_cast<int32_t*>(w.data())[t * k + j]);
        }
      }
      for (size_t r = order.size(); r < static_cast<size_t>(n); ++r) {
        for (int64_t j = 0; j < k; ++j) EXPECT_EQ(tables[f][r * k + j], -1) << "padding row " << r;
      }
    }
  }
  std::vector<int32_t> bad = ids;
  bad[3] = 6;
  std::vector<float> r0(n * h);
  std::vector<int32_t> t0(2 * n * k), sr(n);
  EXPECT_THROW(
      b.AfdDispatch(Tensor(x.data(), DType::kF32, {n, h}), Tensor(bad.data(), DType::kI32, {n, k}),
                    Tensor(w.data(), DType::kF32, {n, k}), E,
                    {Tensor(r0.data(), DType::kF32, {n, h})}, {},
                    {Tensor(t0.data(), DType::kI32, {2 * n * k})},
                    Tensor(sr.data(), DType::kI32, {n, 1}), true),
      Error);
}

TEST(AfdExchange, SumPartialsAddsInRankOrderAndPairIndexPointsIntoEachReply) {
  cpu::CpuBackend b;
  const int64_t n = 2, h = 2;
  std::vector<float> p0 = {1, 2, 3, 4}, p1 = {10, 20, 30, 40}, out(n * h);
  std::vector<int32_t> send_row = {1, -1, 0, 1};  // token 0 row 1 of rank 0; token 1 both
  b.AfdSumPartials({Tensor(p0.data(), DType::kF32, {2, h}), Tensor(p1.data(), DType::kF32, {2, h})},
                   Tensor(send_row.data(), DType::kI32, {n, 2}),
                   Tensor(out.data(), DType::kF32, {n, h}));
  EXPECT_EQ(out, (std::vector<float>{3, 4, 1 + 30, 2 + 40}));
  // Pairs: E = 4 over 2 ranks, k = 2; token 0 -> experts 0, 3; token 1 -> experts 1, 2.
  std::vector<int32_t> ids = {0, 3, 1, 2}, sr = {0, 0, 1, 1};
  std::vector<int32_t> ros0 = {5, -1, 6, -1}, ros1 = {-1, 2, -1, 3};
  std::vector<int32_t> idx(4), shared_idx(2);
  b.AfdPairIndex(
      Tensor(ids.data(), DType::kI32, {2, 2}), 4, Tensor(sr.data(), DType::kI32, {2, 2}),
      {Tensor(ros0.data(), DType::kI32, {2, 2}), Tensor(ros1.data(), DType::kI32, {2, 2})},
      {0, 100}, {0, 50}, Tensor(idx.data(), DType::kI32, {2, 2}),
      Tensor(shared_idx.data(), DType::kI32, {2}));
  EXPECT_EQ(idx, (std::vector<int32_t>{5, 102, 6, 103}));
  EXPECT_EQ(shared_idx, (std::vector<int32_t>{0, 50}));
}

TEST(AfdExchange, ConvertRoundsToBf16AndBackExactly) {
  cpu::CpuBackend b;
  std::vector<float> x = {1.0f, 1.00390625f, -3.5f, 1e-3f}, y(4);
  std::vector<uint16_t> bits(4);
  b.Convert(Tensor(bits.data(), DType::kBF16, {4}), Tensor(x.data(), DType::kF32, {4}));
  b.Convert(Tensor(y.data(), DType::kF32, {4}), Tensor(bits.data(), DType::kBF16, {4}));
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f);  // ties to even
  EXPECT_EQ(y[2], -3.5f);
  EXPECT_NEAR(y[3], 1e-3f, 1e-5f);
}

// The FP8 dispatch (common/fp8_rows.h): per row, groups of 128 elements (the last one partial)
// each with scale = amax / 448 and q = fp8(x * 448 / amax); ranks of one dispatch may mix
// formats; the FFN's DequantFp8Rows reads q * scale.
TEST(AfdExchange, Fp8RowsCarryGroupScalesAndReadBackWithinTheFormatsPrecision) {
  cpu::CpuBackend b;
  const int64_t n = 3, k = 1, h = 200, E = 2, groups = 2;  // 128 + a partial group of 72
  ASSERT_EQ(AfdFp8Groups(h), groups);
  const int F = 2;                       // expert 0 on rank 0, expert 1 on rank 1
  std::vector<int32_t> ids = {0, 0, 1};  // tokens 0, 1 -> rank 0 (FP8); token 2 -> rank 1 (f32)
  std::vector<float> w(n * k, 1.0f), x(n * h, 0.0f);
  for (int64_t c = 0; c < h; ++c) {
    x[c] = std::sin(0.37f * static_cast<float>(c)) * (c < 128 ? 3.0f : 0.01f);
    x[2 * h + c] = static_cast<float>(c);
  }
  x[5] = 2.0f * 3.0f;  // token 0's first group: amax 6
  x[6] = 3.0f;
  x[7] = -1.5f;
  // token 1 stays zero: amax clamped to 1e-4, every q 0
  std::vector<uint8_t> q0(n * h, 0xAA);
  std::vector<float> s0(n * groups, -1.0f), r1(n * h, -1.0f);
  std::vector<int32_t> t0(2 * n * k), t1(2 * n * k), send_row(n * F);
  const std::vector<Tensor> rows = {Tensor(q0.data(), DType::kF8E4M3, {n, h}),
                                    Tensor(r1.data(), DType::kF32, {n, h})};
  const std::vector<Tensor> scales = {Tensor(s0.data(), DType::kF32, {n, groups}), Tensor()};
  const std::vector<Tensor> tables = {Tensor(t0.data(), DType::kI32, {2 * n * k}),
                                      Tensor(t1.data(), DType::kI32, {2 * n * k})};
  b.AfdDispatch(Tensor(x.data(), DType::kF32, {n, h}), Tensor(ids.data(), DType::kI32, {n, k}),
                Tensor(w.data(), DType::kF32, {n, k}), E, rows, scales, tables,
                Tensor(send_row.data(), DType::kI32, {n, F}), /*shared=*/false);
  EXPECT_EQ(send_row, (std::vector<int32_t>{0, -1, 1, -1, -1, 0}));
  // Token 0, group 0: amax 6, so 6 -> 448 (0x7e), 3 -> 224 (0x76), -1.5 -> -112 (0xee).
  EXPECT_EQ(s0[0], 6.0f / 448.0f);
  EXPECT_EQ(q0[5], 0x7e);
  EXPECT_EQ(q0[6], 0x76);
  EXPECT_EQ(q0[7], 0xee);
  float amax1 = 0.0f;
  for (int64_t c = 128; c < h; ++c) amax1 = std::max(amax1, std::fabs(x[c]));
  EXPECT_EQ(s0[1], amax1 / 448.0f);  // the partial group's own scale
  for (int64_t c = 0; c < h; ++c) {
    const float a = c < 128 ? 6.0f : amax1;
    EXPECT_EQ(q0[c], F32ToFp8E4M3(x[c] * (448.0f / a))) << c;
  }
  // Token 1 (zeros): the clamped amax, zero bytes.
  EXPECT_EQ(s0[2], 1e-4f / 448.0f);
  EXPECT_EQ(s0[3], 1e-4f / 448.0f);
  for (int64_t c = 0; c < h; ++c) EXPECT_EQ(q0[h + c], 0) << c;
  // The f32 rank got its token as is.
  for (int64_t c = 0; c < h; ++c) EXPECT_EQ(r1[c], x[2 * h + c]);
  // Read back: within half a step of E4M3's 3-bit mantissa (2^-4 relative), or of its
  // subnormal spacing (2^-9 of the scale) near zero.
  std::vector<float> back(2 * h, -1.0f);
  b.DequantFp8Rows(Tensor(q0.data(), DType::kF8E4M3, {2, h}),
                   Tensor(s0.data(), DType::kF32, {2, groups}),
                   Tensor(back.data(), DType::kF32, {2, h}));
  for (int64_t c = 0; c < h; ++c) {
    const float scale = s0[c / 128];
    EXPECT_EQ(back[c], Fp8E4M3ToF32(q0[c]) * scale);
    EXPECT_LE(std::fabs(back[c] - x[c]),
              std::max(std::fabs(x[c]) * 0.0625f, scale * 0.001953125f) * 1.0001f)
        << c;
    EXPECT_EQ(back[h + c], 0.0f);
  }
  EXPECT_NEAR(back[5], 6.0f, 6.0f * 1e-6f);
  // FP8 rows need their scales (and only they have any).
  EXPECT_THROW(
      b.AfdDispatch(Tensor(x.data(), DType::kF32, {n, h}), Tensor(ids.data(), DType::kI32, {n, k}),
                    Tensor(w.data(), DType::kF32, {n, k}), E, rows, {}, tables,
                    Tensor(send_row.data(), DType::kI32, {n, F}), false),
      Error);
  EXPECT_THROW(
      b.AfdDispatch(Tensor(x.data(), DType::kF32, {n, h}), Tensor(ids.data(), DType::kI32, {n, k}),
                    Tensor(w.data(), DType::kF32, {n, k}), E, rows, {scales[0], scales[0]}, tables,
                    Tensor(send_row.data(), DType::kI32, {n, F}), false),
      Error);
}

}  // namespace
}  // namespace afd::kernels

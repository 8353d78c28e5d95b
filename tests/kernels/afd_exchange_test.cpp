// The AFD exchange ops on the CPU reference (kernels/backend.h, "AFD exchange"): the dispatch
// layout (each token once per FFN rank that needs it, owned tokens first), the sum of partials,
// the per-pair index, and f32 <-> bf16. The GPU kernels are checked against the monolithic run
// on the device (tools/device/afd_exchange_check.sh).
#include "afd/kernels/afd_exchange.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"

namespace afd::kernels {
namespace {

TEST(AfdExchange, OwnerFollowsSplitOffset) {
  for (int64_t e_total : {4, 7, 64, 65}) {
    for (int f_total : {1, 2, 3, 5}) {
      if (f_total > e_total) continue;
      // Rank f holds E / F experts, the first E % F ranks one more (SplitOffset's rule).
      int64_t begin = 0;
      for (int f = 0; f < f_total; ++f) {
        const int64_t size = e_total / f_total + (f < e_total % f_total ? 1 : 0);
        for (int64_t e = begin; e < begin + size; ++e) EXPECT_EQ(AfdOwner(e, e_total, f_total), f);
        begin += size;
      }
    }
  }
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
                  Tensor(w.data(), DType::kF32, {n, k}), E, rt, tt,
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
        if (AfdOwner(ids[t * k], E, F) == f || AfdOwner(ids[t * k + 1], E, F) == f) {
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
                    {Tensor(r0.data(), DType::kF32, {n, h})},
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

}  // namespace
}  // namespace afd::kernels

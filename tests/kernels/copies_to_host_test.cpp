// Backend::StartCopyToHost / FinishCopyToHost on the CPU backend (the base class's copies): the
// values at the copy's place in the op order, each ticket finished once (in any order), a
// bounded number open.
#include <gtest/gtest.h>

#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"

namespace afd::kernels {
namespace {

TEST(CopiesToHost, TakeTheValuesOfTheirPlaceAndFinishOnce) {
  cpu::CpuBackend b;
  std::vector<int32_t> host = {1, 2, 3};
  const Tensor t(host.data(), DType::kI32, {3}, b.device());
  const int64_t first = b.StartCopyToHost(t);
  host = {7, 8, 9};  // later work
  const int64_t second = b.StartCopyToHost(t);
  std::vector<int32_t> got(3);
  b.FinishCopyToHost(second, got.data());  // another engine's first (several may share one)
  EXPECT_EQ(got, (std::vector<int32_t>{7, 8, 9}));
  b.FinishCopyToHost(first, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_THROW(b.FinishCopyToHost(first, got.data()), Error);  // finished already
  EXPECT_THROW(b.FinishCopyToHost(12345, got.data()), Error);  // never started
  std::vector<int64_t> open;
  for (int64_t i = 0; i < Backend::kMaxCopiesToHost; ++i) open.push_back(b.StartCopyToHost(t));
  EXPECT_THROW(b.StartCopyToHost(t), Error);  // too many open
  for (int64_t ticket : open) b.FinishCopyToHost(ticket, got.data());
  EXPECT_NO_THROW(b.FinishCopyToHost(b.StartCopyToHost(t), got.data()));
}

TEST(CopiesToHost, TakeIdsKeepsTokensWithoutASource) {
  cpu::CpuBackend b;
  std::vector<int32_t> from = {40, 41, 42}, source = {2, -1, 0, 9}, ids = {5, 6, 7, 8};
  const Tensor f(from.data(), DType::kI32, {3}, b.device());
  const Tensor s(source.data(), DType::kI32, {3}, b.device());
  const Tensor i(ids.data(), DType::kI32, {3}, b.device());
  b.TakeIds(f, s, i);
  EXPECT_EQ(ids, (std::vector<int32_t>{42, 6, 40, 8}));
  const Tensor s4(source.data(), DType::kI32, {4}, b.device());
  const Tensor i4(ids.data(), DType::kI32, {4}, b.device());
  EXPECT_THROW(b.TakeIds(f, s4, i4), Error);  // source 9 of 3 ids
}

}  // namespace
}  // namespace afd::kernels

// Tensor views and the per-step Workspace arena (stable addresses within a step, no allocation
// once a step's size has been seen), the KV block allocator and paged cache bookkeeping.
#include "afd/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "afd/common/error.h"
#include "afd/tensor/workspace.h"
#include "testing/host_allocator.h"

namespace afd {
namespace {

using testing_util::CountingAllocator;

TEST(Tensor, ViewsShapesAndErrors) {
  Tensor t = Tensor::HostZeros(DType::kF32, {4, 3, 2});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(-1), 2);
  EXPECT_EQ(t.stride(0), 6);
  EXPECT_TRUE(t.is_contiguous());
  const Tensor rows = t.Rows(1, 2);
  EXPECT_EQ(rows.data_as<float>(), t.data_as<float>() + 6);
  EXPECT_EQ(rows.owner(), t.owner());  // a view keeps the memory alive
  EXPECT_EQ(t.Reshape({-1, 2}).dim(0), 12);
  EXPECT_THROW(t.Reshape({5, -1}), Error);
  EXPECT_THROW(t.Rows(3, 2), Error);
  EXPECT_THROW(t.Expect("x", DType::kF32, {4, 3}), Error);
  EXPECT_NO_THROW(t.Expect("x", DType::kF32, {-1, 3, 2}));
  try {
    t.Expect("Linear x", DType::kBF16, {4, 3, 2});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Linear x: expected bfloat16[4, 3, 2], got float32"),
              std::string::npos)
        << e.what();
  }
}

TEST(Workspace, AddressesStayPutAndSteadyStepsAllocateNothing) {
  CountingAllocator alloc;
  Workspace ws(alloc, 1024);
  EXPECT_EQ(alloc.calls, 1);
  std::set<void*> seen;
  std::vector<float*> first;
  for (int i = 0; i < 10; ++i) {  // outgrows the first chunk: more chunks, old tensors unmoved
    Tensor t = ws.Take(DType::kF32, {100});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 256, 0u);
    EXPECT_TRUE(seen.insert(t.data()).second);
    t.data_as<float>()[0] = static_cast<float>(i);
    first.push_back(t.data_as<float>());
  }
  for (int i = 0; i < 10; ++i) EXPECT_EQ(first[i][0], static_cast<float>(i));
  EXPECT_GT(alloc.calls, 1);
  ws.Reset();  // merged into one chunk of the high-water size
  const int after_merge = alloc.calls;
  for (int step = 0; step < 5; ++step) {
    for (int i = 0; i < 10; ++i) ws.Take(DType::kF32, {100});
    ws.Reset();
  }
  EXPECT_EQ(alloc.calls, after_merge);
  EXPECT_GE(ws.capacity(), ws.high_water());
}

TEST(Workspace, RewindReusesALayersScratchAndKeepsWhatCameBefore) {
  CountingAllocator alloc;
  Workspace ws(alloc, 4096);
  Tensor kept = ws.Take(DType::kF32, {64});
  kept.data_as<float>()[0] = 42.0f;
  void* first_scratch = nullptr;
  for (int layer = 0; layer < 5; ++layer) {
    const Workspace::Mark m = ws.mark();
    Tensor a = ws.Take(DType::kF32, {300});  // outgrows the first chunk on the way
    Tensor b = ws.Take(DType::kF32, {700});
    if (layer == 0) first_scratch = a.data();
    EXPECT_EQ(a.data(), first_scratch) << "layer " << layer;  // the same memory every layer
    ws.Rewind(m);
    (void)b;
  }
  EXPECT_EQ(kept.data_as<float>()[0], 42.0f);
  const size_t peak = ws.high_water();
  EXPECT_LT(peak, 2 * (256 + 1280 + 2816));  // one layer's worth, not five
  ws.Reset();
  const int calls = alloc.calls;
  for (int step = 0; step < 3; ++step) {  // steady steps: same addresses, no allocation
    ws.Take(DType::kF32, {64});
    const Workspace::Mark m = ws.mark();
    ws.Take(DType::kF32, {300});
    ws.Take(DType::kF32, {700});
    ws.Rewind(m);
    ws.Reset();
  }
  EXPECT_EQ(alloc.calls, calls);
}

}  // namespace
}  // namespace afd

// The paged latent cache and its block allocator.
#include "afd/kv/paged_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "afd/common/error.h"
#include "afd/kv/block_allocator.h"
#include "testing/host_allocator.h"

namespace afd {
namespace {

using testing_util::CountingAllocator;

TEST(PagedKvCache, BlocksTablesSlotsAndRelease) {
  CountingAllocator alloc;
  kv::CacheShape shape{2, 8, 4, 5};  // 2 layers, width 8, block 4, 5 blocks
  kv::PagedKvCache cache(alloc, shape);
  EXPECT_EQ(cache.Layer(1).dim(0), 20);
  const int64_t a = cache.AddSequence(), b = cache.AddSequence();
  ASSERT_TRUE(cache.Reserve(a, 9));  // 3 blocks
  ASSERT_TRUE(cache.Reserve(b, 4));  // 1 block
  EXPECT_EQ(cache.num_free_blocks(), 1);
  EXPECT_FALSE(cache.Reserve(b, 9));  // needs 2 more: nothing changes
  EXPECT_EQ(cache.capacity(b), 4);
  EXPECT_EQ(cache.Slot(a, 5), cache.block_table(a)[1] * 4 + 1);
  EXPECT_THROW(cache.Slot(a, 12), Error);
  cache.Release(a);
  EXPECT_EQ(cache.num_free_blocks(), 4);
  EXPECT_TRUE(cache.Reserve(b, 17));
  EXPECT_THROW(cache.length(a), Error);
  kv::BlockAllocator blocks(3);
  auto got = blocks.Allocate(2);
  ASSERT_TRUE(got.has_value());
  blocks.Free(*got);
  EXPECT_THROW(blocks.Free(*got), Error);  // double free
}

// Rows of bf16 (--kv-cache-dtype bf16) take half the bytes; other dtypes are refused.
TEST(PagedKvCache, Bf16RowsHalveTheMemory) {
  CountingAllocator alloc;
  kv::CacheShape shape{2, 8, 4, 5};
  const int64_t f32_bytes = shape.bytes();
  shape.dtype = DType::kBF16;
  EXPECT_EQ(shape.bytes() * 2, f32_bytes);
  kv::PagedKvCache cache(alloc, shape);
  EXPECT_EQ(cache.Layer(1).dtype(), DType::kBF16);
  EXPECT_EQ(cache.Layer(1).nbytes() * 2 * 2, static_cast<size_t>(f32_bytes));
  shape.dtype = DType::kI32;
  EXPECT_THROW(kv::PagedKvCache(alloc, shape), Error);
}

}  // namespace
}  // namespace afd

#include "afd/kv/block_allocator.h"

#include "afd/common/error.h"

namespace afd::kv {

BlockAllocator::BlockAllocator(int64_t num_blocks) : num_blocks_(num_blocks), held_(num_blocks, 0) {
  AFD_CHECK(num_blocks > 0 && num_blocks <= INT32_MAX, "KV cache: {} blocks", num_blocks);
  free_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<std::vector<int32_t>> BlockAllocator::Allocate(int64_t count) {
  AFD_CHECK(count >= 0, "KV cache: allocate {} blocks", count);
  if (count > num_free()) return std::nullopt;
  std::vector<int32_t> out(free_.end() - count, free_.end());
  free_.resize(free_.size() - count);
  for (int32_t b : out) held_[b] = 1;
  return out;
}

void BlockAllocator::Free(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    AFD_CHECK(b >= 0 && b < num_blocks_ && held_[b], "KV cache: block {} freed but not held", b);
    held_[b] = 0;
    free_.push_back(b);
  }
}

}  // namespace afd::kv

// Fixed pool of KV cache blocks, handed out by id. Which blocks a sequence holds is its block
// table (paged_cache.h).
// Invariants: every id in [0, num_blocks) is either free or held by exactly one owner.
// Thread safety: none; the scheduler's thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace afd::kv {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  // `count` block ids, or nothing (and no change) when fewer are free.
  std::optional<std::vector<int32_t>> Allocate(int64_t count);
  // Returns blocks to the pool; a block that is not held is an afd::Error (double free).
  void Free(const std::vector<int32_t>& blocks);

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::vector<char> held_;     // [num_blocks]
};

}  // namespace afd::kv

// The paged MLA latent cache: per layer, a pool of slots (num_blocks x block_size) of
// row_width = kv_lora_rank + qk_rope_head_dim values (fp32, or bf16) -- the kv_a_layernorm-ed
// latent c followed
// by the roped shared key k_pe of one token. A sequence holds whole blocks (its block table);
// position p of a sequence lives in slot table[p / block_size]·block_size + p % block_size.
// Blocks return to the pool when a sequence is released.
//
// Memory: one device tensor [num_layers, num_blocks·block_size, row_width] of shape.dtype from the
// backend's allocator, allocated once.
// Thread safety: none; the scheduler's thread.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "afd/kv/block_allocator.h"
#include "afd/tensor/allocator.h"
#include "afd/tensor/tensor.h"

namespace afd::kv {

inline constexpr int64_t kDefaultBlockSize = 64;

struct CacheShape {
  int64_t num_layers = 0;
  int64_t row_width = 0;
  int64_t block_size = kDefaultBlockSize;
  int64_t num_blocks = 0;
  DType dtype = DType::kF32;  // of the rows: kF32, or kBF16 (half the memory; bf16 models)
  // Blocks holding `tokens` positions.
  int64_t BlocksFor(int64_t tokens) const { return (tokens + block_size - 1) / block_size; }
  int64_t bytes() const {
    return num_layers * num_blocks * block_size * row_width *
           static_cast<int64_t>(DTypeSize(dtype));
  }
};

class PagedKvCache {
 public:
  PagedKvCache(Allocator& allocator, const CacheShape& shape);

  const CacheShape& shape() const { return shape_; }
  int64_t block_size() const { return shape_.block_size; }
  int64_t num_free_blocks() const { return blocks_.num_free(); }
  int64_t num_used_blocks() const { return shape_.num_blocks - blocks_.num_free(); }

  // A new empty sequence (no blocks); returns its id (never reused).
  int64_t AddSequence();
  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Makes room for positions [0, length) of `seq`: false (nothing changes) when the pool has
  // too few free blocks.
  bool Reserve(int64_t seq, int64_t length);
  // Frees the sequence's blocks and forgets it.
  void Release(int64_t seq);
  // Positions of `seq` already written (the position of its next token).
  int64_t length(int64_t seq) const;
  int64_t capacity(int64_t seq) const;  // reserved positions
  const std::vector<int32_t>& block_table(int64_t seq) const;
  // The slot of position `pos` < capacity(seq).
  int64_t Slot(int64_t seq, int64_t pos) const;
  // Slot of position `pos` in a block table (as block_table gives it), or -1 past its blocks:
  // one lookup of the sequence for many positions.
  int64_t SlotIn(const std::vector<int32_t>& blocks, int64_t pos) const {
    if (pos < 0 || pos >= static_cast<int64_t>(blocks.size()) * shape_.block_size) return -1;
    return static_cast<int64_t>(blocks[pos / shape_.block_size]) * shape_.block_size +
           pos % shape_.block_size;
  }
  // length(seq) = max(length(seq), length), within capacity(seq): one lookup.
  void Extend(int64_t seq, int64_t length);

  // Layer l's slots: [num_blocks·block_size, row_width] of shape().dtype.
  Tensor Layer(int64_t layer) const;
  // Every layer's slots: [num_layers, num_blocks·block_size, row_width], one allocation.
  const Tensor& storage() const { return storage_; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t length = 0;
  };
  const Sequence& Get(int64_t seq) const;

  CacheShape shape_;
  BlockAllocator blocks_;
  Tensor storage_;  // [num_layers, num_slots, row_width]
  std::unordered_map<int64_t, Sequence> seqs_;
  int64_t next_id_ = 0;
};

}  // namespace afd::kv

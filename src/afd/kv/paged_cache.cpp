#include "afd/kv/paged_cache.h"

#include "afd/common/error.h"

namespace afd::kv {

PagedKvCache::PagedKvCache(Allocator& allocator, const CacheShape& shape)
    : shape_(shape), blocks_(shape.num_blocks) {
  AFD_CHECK(shape.num_layers > 0 && shape.row_width > 0 && shape.block_size > 0,
            "KV cache: {} layers, row width {}, block size {}", shape.num_layers, shape.row_width,
            shape.block_size);
  AFD_CHECK(shape.dtype == DType::kF32 || shape.dtype == DType::kBF16,
            "KV cache: rows of {}; the cache holds f32 or bf16", DTypeName(shape.dtype));
  const int64_t slots = shape.num_blocks * shape.block_size;
  std::shared_ptr<void> memory = allocator.Allocate(static_cast<size_t>(shape.bytes()));
  storage_ = Tensor(memory.get(), shape.dtype, {shape.num_layers, slots, shape.row_width},
                    allocator.device(), memory);
}

int64_t PagedKvCache::AddSequence() {
  seqs_.emplace(next_id_, Sequence{});
  return next_id_++;
}

const PagedKvCache::Sequence& PagedKvCache::Get(int64_t seq) const {
  auto it = seqs_.find(seq);
  AFD_CHECK(it != seqs_.end(), "KV cache: no sequence {}", seq);
  return it->second;
}

bool PagedKvCache::Reserve(int64_t seq, int64_t length) {
  Sequence& s = const_cast<Sequence&>(Get(seq));
  const int64_t need = shape_.BlocksFor(length) - static_cast<int64_t>(s.blocks.size());
  if (need <= 0) return true;
  auto got = blocks_.Allocate(need);
  if (!got) return false;
  s.blocks.insert(s.blocks.end(), got->begin(), got->end());
  return true;
}

void PagedKvCache::Release(int64_t seq) {
  blocks_.Free(Get(seq).blocks);
  seqs_.erase(seq);
}

int64_t PagedKvCache::length(int64_t seq) const { return Get(seq).length; }

int64_t PagedKvCache::capacity(int64_t seq) const {
  return static_cast<int64_t>(Get(seq).blocks.size()) * shape_.block_size;
}

const std::vector<int32_t>& PagedKvCache::block_table(int64_t seq) const { return Get(seq).blocks; }

int64_t PagedKvCache::Slot(int64_t seq, int64_t pos) const {
  const Sequence& s = Get(seq);
  const int64_t slot = SlotIn(s.blocks, pos);
  AFD_CHECK(slot >= 0, "KV cache: position {} of sequence {} is outside its {} reserved positions",
            pos, seq, static_cast<int64_t>(s.blocks.size()) * shape_.block_size);
  return slot;
}

void PagedKvCache::Extend(int64_t seq, int64_t length) {
  Sequence& s = const_cast<Sequence&>(Get(seq));
  if (length <= s.length) return;
  const int64_t cap = static_cast<int64_t>(s.blocks.size()) * shape_.block_size;
  AFD_CHECK(length <= cap, "KV cache: sequence {} length {} exceeds its {} reserved positions", seq,
            length, cap);
  s.length = length;
}

Tensor PagedKvCache::Layer(int64_t layer) const {
  AFD_CHECK(layer >= 0 && layer < shape_.num_layers, "KV cache: no layer {}", layer);
  return storage_.Rows(layer, 1).Reshape({storage_.dim(1), storage_.dim(2)});
}

}  // namespace afd::kv

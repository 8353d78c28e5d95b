#include "afd/model/kv_cache.h"

#include "afd/common/error.h"

namespace afd::model {

MlaKvCache::MlaKvCache(int64_t num_layers, int64_t kv_lora_rank, int64_t rope_dim)
    : num_layers_(num_layers), kv_lora_rank_(kv_lora_rank), rope_dim_(rope_dim) {}

int MlaKvCache::AddSequence(int64_t capacity) {
  AFD_CHECK(capacity > 0, "KV cache: capacity must be > 0, got {}", capacity);
  Sequence s;
  s.capacity = capacity;
  s.rows.assign(num_layers_ * capacity * row_width(), 0.0f);
  seqs_.push_back(std::move(s));
  return static_cast<int>(seqs_.size()) - 1;
}

void MlaKvCache::SetLength(int seq, int64_t length) {
  Sequence& s = seqs_.at(seq);
  AFD_CHECK(length >= 0 && length <= s.capacity,
            "KV cache: sequence {} length {} exceeds its "
            "capacity {}",
            seq, length, s.capacity);
  s.length = length;
}

float* MlaKvCache::Row(int64_t layer, int seq, int64_t pos) {
  Sequence& s = seqs_.at(seq);
  AFD_CHECK(pos >= 0 && pos < s.capacity && layer >= 0 && layer < num_layers_,
            "KV cache: row (layer {}, sequence {}, position {}) is outside the cache (capacity "
            "{})",
            layer, seq, pos, s.capacity);
  return s.rows.data() + (layer * s.capacity + pos) * row_width();
}

const float* MlaKvCache::Row(int64_t layer, int seq, int64_t pos) const {
  return const_cast<MlaKvCache*>(this)->Row(layer, seq, pos);
}

void MlaKvCache::ReleaseSequence(int seq) {
  Sequence& s = seqs_.at(seq);
  std::vector<float>().swap(s.rows);
  s.capacity = 0;
  s.length = 0;
}

}  // namespace afd::model

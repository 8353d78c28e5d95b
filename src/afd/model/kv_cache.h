// The MLA KV cache: per layer, sequence and position, one row of kv_lora_rank + qk_rope_head_dim
// floats: the kv_a_layernorm-ed latent c followed by the roped shared key k_pe. K and V of each
// head are recomputed from c through kv_b_proj (absorbed into q and the output, see
// attention.h), so the cache never holds expanded per-head K/V.
// Layout of a sequence's storage: [num_layers, capacity, row_width] fp32.
// Thread safety: none; one forward step at a time.
#pragma once

#include <cstdint>
#include <vector>

namespace afd::model {

class MlaKvCache {
 public:
  MlaKvCache(int64_t num_layers, int64_t kv_lora_rank, int64_t rope_dim);

  // Adds an empty sequence with room for `capacity` tokens; returns its slot (0, 1, ...).
  int AddSequence(int64_t capacity);
  int num_sequences() const { return static_cast<int>(seqs_.size()); }
  // Tokens stored for `seq` (the position of its next token).
  int64_t length(int seq) const { return seqs_.at(seq).length; }
  int64_t capacity(int seq) const { return seqs_.at(seq).capacity; }
  // Frees the storage of a finished sequence; its slot number stays taken.
  void ReleaseSequence(int seq);
  // Marks positions [0, length) of `seq` as filled; length <= capacity.
  void SetLength(int seq, int64_t length);

  int64_t row_width() const { return kv_lora_rank_ + rope_dim_; }
  int64_t kv_lora_rank() const { return kv_lora_rank_; }
  // Row of (layer, seq, pos), pos < capacity: [kv_lora_rank latent | rope_dim k_pe].
  float* Row(int64_t layer, int seq, int64_t pos);
  const float* Row(int64_t layer, int seq, int64_t pos) const;

 private:
  struct Sequence {
    int64_t capacity = 0;
    int64_t length = 0;
    std::vector<float> rows;  // [num_layers, capacity, row_width]
  };
  int64_t num_layers_;
  int64_t kv_lora_rank_;
  int64_t rope_dim_;
  std::vector<Sequence> seqs_;
};

}  // namespace afd::model

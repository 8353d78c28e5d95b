// The tokens of one forward step. Several sequences may share a step; each contributes tokens
// at consecutive positions that continue what its KV cache slot already holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace afd::model {

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [n]
  std::vector<int32_t> seq_slots;  // [n] KV cache slot of each token
  std::vector<int64_t> positions;  // [n] position of each token in its sequence

  int64_t size() const { return static_cast<int64_t>(token_ids.size()); }
  // Appends `ids` of sequence `slot` at positions start, start + 1, ...
  void Add(int32_t slot, const std::vector<int32_t>& ids, int64_t start) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      token_ids.push_back(ids[i]);
      seq_slots.push_back(slot);
      positions.push_back(start + static_cast<int64_t>(i));
    }
  }
};

}  // namespace afd::model

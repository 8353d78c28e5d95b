#include "afd/model/forward_batch.h"

#include <algorithm>

namespace afd::model {

void ForwardBatch::Add(const kv::PagedKvCache& cache, int64_t seq, std::span<const int32_t> ids,
                       int64_t start, Logits logits) {
  auto it = std::find(seq_ids.begin(), seq_ids.end(), seq);
  int32_t row = static_cast<int32_t>(it - seq_ids.begin());
  if (it == seq_ids.end()) {
    seq_ids.push_back(seq);
    block_tables.push_back(cache.block_table(seq));
  } else {
    block_tables[row] = cache.block_table(seq);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t pos = start + static_cast<int64_t>(i);
    if (logits == Logits::kAll || (logits == Logits::kLast && i + 1 == ids.size())) {
      logits_rows.push_back(static_cast<int32_t>(token_ids.size()));
    }
    token_ids.push_back(ids[i]);
    positions.push_back(pos);
    seq_index.push_back(row);
    slot_mapping.push_back(cache.Slot(seq, pos));
  }
}

ForwardBatch ForwardBatch::Slice(int64_t begin, int64_t count) const {
  ForwardBatch b;
  b.seq_ids = seq_ids;
  b.block_tables = block_tables;
  auto cut = [begin, count](const auto& v) {
    return std::decay_t<decltype(v)>(v.begin() + begin, v.begin() + begin + count);
  };
  b.token_ids = cut(token_ids);
  b.positions = cut(positions);
  b.seq_index = cut(seq_index);
  b.slot_mapping = cut(slot_mapping);
  for (int32_t r : logits_rows) {
    if (r >= begin && r < begin + count) b.logits_rows.push_back(static_cast<int32_t>(r - begin));
  }
  return b;
}

bool ForwardBatch::HasPrefill() const {
  for (int64_t i = 0; i < size(); ++i) {
    const bool alone = (i == 0 || seq_index[i - 1] != seq_index[i]) &&
                       (i + 1 == size() || seq_index[i + 1] != seq_index[i]);
    if (!alone || positions[i] == 0) return true;
  }
  return false;
}

}  // namespace afd::model

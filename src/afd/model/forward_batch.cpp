#include "afd/model/forward_batch.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::model {

namespace {

// The tokens of row `row` (sequence seq, blocks as the cache holds them).
void AppendTokens(ForwardBatch& b, const kv::PagedKvCache& cache, int64_t seq,
                  const std::vector<int32_t>& blocks, int32_t row, std::span<const int32_t> ids,
                  int64_t start, ForwardBatch::Logits logits) {
  using Logits = ForwardBatch::Logits;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t pos = start + static_cast<int64_t>(i);
    if (logits == Logits::kAll || (logits == Logits::kLast && i + 1 == ids.size())) {
      b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size()));
    }
    const int64_t slot = cache.SlotIn(blocks, pos);
    AFD_CHECK(slot >= 0,
              "KV cache: position {} of sequence {} is outside its {} reserved positions", pos, seq,
              cache.capacity(seq));
    b.token_ids.push_back(ids[i]);
    b.positions.push_back(pos);
    b.seq_index.push_back(row);
    b.slot_mapping.push_back(slot);
  }
}

}  // namespace

void ForwardBatch::Add(const kv::PagedKvCache& cache, int64_t seq, std::span<const int32_t> ids,
                       int64_t start, Logits logits) {
  auto it = std::find(seq_ids.begin(), seq_ids.end(), seq);
  if (it == seq_ids.end()) {
    AddNew(cache, seq, ids, start, logits);
    return;
  }
  const auto row = static_cast<int32_t>(it - seq_ids.begin());
  block_tables[row] = cache.block_table(seq);
  AppendTokens(*this, cache, seq, block_tables[row], row, ids, start, logits);
}

void ForwardBatch::AddNew(const kv::PagedKvCache& cache, int64_t seq, std::span<const int32_t> ids,
                          int64_t start, Logits logits) {
  const auto row = static_cast<int32_t>(seq_ids.size());
  seq_ids.push_back(seq);
  block_tables.push_back(cache.block_table(seq));
  AppendTokens(*this, cache, seq, block_tables.back(), row, ids, start, logits);
}

void ForwardBatch::Reserve(int64_t tokens, int64_t rows) {
  token_ids.reserve(tokens);
  positions.reserve(tokens);
  seq_index.reserve(tokens);
  slot_mapping.reserve(tokens);
  logits_rows.reserve(tokens);
  seq_ids.reserve(rows);
  block_tables.reserve(rows);
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
  if (!id_source.empty()) b.id_source = cut(id_source);
  b.ids_from = ids_from;
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

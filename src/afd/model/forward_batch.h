// The tokens of one forward step, on the host. Several sequences may share a step; each
// contributes tokens at consecutive positions that continue what its KV cache sequence already
// holds. Built by the scheduler/generator, uploaded by MoeModel::Upload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "afd/kv/paged_cache.h"
#include "afd/tensor/tensor.h"

namespace afd::model {

struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [n]
  std::vector<int64_t> positions;     // [n] position of each token in its sequence
  std::vector<int32_t> seq_index;     // [n] row of block_tables of the token's sequence
  std::vector<int64_t> slot_mapping;  // [n] cache slot the token's row is written to
  std::vector<int64_t> seq_ids;       // [rows] cache sequence of each block-table row
  std::vector<std::vector<int32_t>> block_tables;  // [rows][blocks]
  // Tokens whose logits the step returns, ascending (e.g. each sequence's last token; all
  // tokens when prompt log-probabilities are wanted).
  std::vector<int32_t> logits_rows;
  // Asynchronous scheduling (runtime/engine.h): ids only the device holds yet. Empty, or [n]:
  // token t with id_source[t] >= 0 takes ids_from[id_source[t]] (the previous step's sampled
  // ids, i32 on the backend's device) in place of token_ids[t], a placeholder.
  std::vector<int32_t> id_source;
  Tensor ids_from;

  int64_t size() const { return static_cast<int64_t>(token_ids.size()); }
  // True when some token is a prefill token: not its sequence's only token in the step, or at
  // position 0 (every other token is a decode token).
  bool HasPrefill() const;
  // Appends `ids` of cache sequence `seq` at positions start, start + 1, ...; the cache must have
  // room reserved for them (PagedKvCache::Reserve). want_logits: rows of every appended token
  // (all) or only the last one (last_only).
  enum class Logits { kNone, kLast, kAll };
  void Add(const kv::PagedKvCache& cache, int64_t seq, std::span<const int32_t> ids, int64_t start,
           Logits logits);
  // Add for a sequence known not to be in the batch yet (the scheduler plans each once a step):
  // no search of the rows. A second row for one sequence fails CheckBatch (its positions).
  void AddNew(const kv::PagedKvCache& cache, int64_t seq, std::span<const int32_t> ids,
              int64_t start, Logits logits);
  // Room for `tokens` tokens and `rows` sequences without reallocating.
  void Reserve(int64_t tokens, int64_t rows);
  // Tokens [begin, begin + count) with the same block tables; logits_rows keeps those in range
  // (renumbered).
  ForwardBatch Slice(int64_t begin, int64_t count) const;
};

}  // namespace afd::model

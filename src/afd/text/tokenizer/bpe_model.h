// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocab, merges ("a b" strings or
// ["a", "b"] pairs), continuing_subword_prefix / end_of_word_suffix, unk_token with fuse_unk,
// byte_fallback (<0xXX> tokens) and ignore_merges. dropout must be null or 0 (deterministic).
//
// Merging follows HF tokenizers: the lowest-rank adjacent pair is merged first, the leftmost on
// ties, with a priority queue over a linked list of symbols (O(n log n) per word). Results of
// words up to 256 bytes are cached (at most 10,000 words).
//
// Thread safety: Tokenize may be called from several threads (the cache has its own mutex).
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "afd/common/thread_annotations.h"

namespace afd::text {

class BpeModel {
 public:
  // Throws afd::Error naming the field for a malformed config or a merge outside the vocab.
  BpeModel(const nlohmann::json& config, const std::string& where);

  // Appends the ids of one pre-tokenized piece to *ids.
  void Tokenize(std::string_view piece, std::vector<uint32_t>* ids) const;

  std::optional<uint32_t> TokenToId(std::string_view token) const;
  // The token of `id`, or nullptr when the vocab has no such id.
  const std::string* IdToToken(uint32_t id) const;
  size_t VocabSize() const { return vocab_.size(); }
  // One past the largest id of the vocab (ids may have gaps).
  size_t IdEnd() const { return id_to_token_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    uint32_t new_id;
  };
  static uint64_t PairKey(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  void MergeWord(std::string_view word, std::vector<uint32_t>* ids) const;
  void Symbols(std::string_view word, std::vector<uint32_t>* ids,
               std::vector<uint32_t>* lens) const;

  std::unordered_map<std::string, uint32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable Mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache_ AFD_GUARDED_BY(cache_mu_);
};

}  // namespace afd::text

// Added and special tokens of tokenizer.json ("added_tokens"). They are matched in the input
// before normalization and pre-tokenization, as HF tokenizers does: first the tokens with
// normalized=false on the raw text, then those with normalized=true (their content normalized) on
// each normalized remaining segment. Matching is leftmost-longest; single_word rejects a match
// touching a word character, lstrip/rstrip absorb the whitespace beside the token.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "afd/text/tokenizer/normalizer.h"

namespace afd::text {

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A part of the input: an added token (id set) or text still to be tokenized.
struct TextSegment {
  std::string text;
  std::optional<uint32_t> id;
  bool at_start = false;  // begins at offset 0 of the whole input
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `tokens` is tokenizer.json's "added_tokens" array; `normalizer` (may be null) normalizes the
  // content of normalized tokens and is used by Split.
  AddedVocabulary(const nlohmann::json& tokens, const Normalizer* normalizer,
                  const std::string& where);

  // Splits `text` into added tokens and normalized text segments, in order.
  std::vector<TextSegment> Split(const std::string& text) const;

  // In the order of tokenizer.json.
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* FindById(uint32_t id) const;
  std::optional<uint32_t> FindByContent(std::string_view content) const;

 private:
  // Leftmost-longest matcher over a set of strings, bucketed by first byte, longest first.
  struct Matcher {
    std::vector<std::vector<size_t>> by_first_byte = std::vector<std::vector<size_t>>(256);
    std::vector<std::string> patterns;
    std::vector<size_t> token_index;  // pattern -> tokens_ index
    void Add(std::string pattern, size_t token);
    void Finish();
  };
  void SplitWith(const Matcher& matcher, TextSegment segment, std::vector<TextSegment>* out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<uint32_t, size_t> by_id_;
  std::unordered_map<std::string, uint32_t> by_content_;
  Matcher raw_;
  Matcher normalized_;
  const Normalizer* normalizer_ = nullptr;
};

}  // namespace afd::text

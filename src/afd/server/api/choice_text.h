// The text of one choice as its tokens arrive: incremental detokenization plus stop strings.
// Text is released as soon as it is final: never a part that could still become the start of
// a stop string (the last max-stop-length - 1 bytes are held back), never half a UTF-8
// character. When a stop string appears, the text ends just before it (vLLM's default), or
// just after it with include_stop_str_in_output. The released pieces concatenate to the same text
// whatever the token boundaries, so a streamed response equals a non-streamed one.
// Without a tokenizer there is no text: Add and Finish return "".
//
// Thread safety: one instance per choice; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "afd/text/tokenizer/incremental_detokenizer.h"

namespace afd::server::api {

class ChoiceText {
 public:
  ChoiceText(const text::Tokenizer* tokenizer, std::vector<std::string> stop,
             bool skip_special_tokens, bool include_stop = false);

  // Adds one generated token; returns the newly final text. Call only while !stopped().
  std::string Add(int32_t id);
  // The sequence ended without a stop string so far: returns the held-back text (a stop string
  // may still match in it, then stopped() becomes true).
  std::string Finish();

  bool stopped() const { return !stop_string_.empty(); }
  const std::string& stop_string() const { return stop_string_; }  // the one that matched
  const std::string& text() const { return text_; }                // detokenized so far

 private:
  // Looks for a stop string ending in text_ after byte `new_from`; on a match cuts text_.
  void MatchStop(size_t new_from);
  std::string Release(bool all);

  std::unique_ptr<text::IncrementalDetokenizer> detokenizer_;  // null without a tokenizer
  std::vector<std::string> stop_;
  bool include_stop_ = false;
  size_t max_stop_len_ = 0;
  std::string text_;
  size_t released_ = 0;  // bytes of text_ returned so far
  std::string stop_string_;
};

}  // namespace afd::server::api

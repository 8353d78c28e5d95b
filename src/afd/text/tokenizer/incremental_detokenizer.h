// Streaming detokenization: ids arrive one at a time and text is emitted as soon as it is final.
// Guarantees: every emitted piece is valid UTF-8 and never ends inside a character, and the
// pieces of Add() calls followed by Flush() concatenate to tokenizer.Decode(all ids).
//
// Method (as HF's DecodeStream / vLLM): decode a window that starts a few tokens back (the
// "prefix", already emitted) and emit what the new ids add beyond the prefix's text, unless that
// ends in U+FFFD (bytes of a character still to come). With a ByteFallback decoder nothing is
// emitted while the last id is a <0xXX> byte token, since a run of them decodes as a whole.
//
// Thread safety: one instance per stream; not thread-safe. The tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "afd/text/tokenizer/tokenizer.h"

namespace afd::text {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Adds one id; returns the newly final text (possibly empty).
  std::string Add(uint32_t id);
  // Ends the stream; returns whatever was held back.
  std::string Flush();

 private:
  std::string DecodeFrom(size_t begin, size_t end) const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<uint32_t> ids_;
  size_t prefix_begin_ = 0;  // window start
  size_t read_end_ = 0;      // ids before this are emitted
  std::string prefix_text_;  // DecodeFrom(prefix_begin_, read_end_)
  std::string emitted_;      // everything returned so far
};

}  // namespace afd::text

#include "afd/text/tokenizer/incremental_detokenizer.h"

namespace afd::text {

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::DecodeFrom(size_t begin, size_t end) const {
  return tokenizer_.Decode(std::vector<uint32_t>(ids_.begin() + begin, ids_.begin() + end),
                           skip_special_tokens_);
}

std::string IncrementalDetokenizer::Add(uint32_t id) {
  ids_.push_back(id);
  if (tokenizer_.IsPendingByte(id)) return "";  // a later byte may turn the run into U+FFFDs
  std::string text = DecodeFrom(prefix_begin_, ids_.size());
  if (text.size() <= prefix_text_.size() || EndsWithReplacement(text) ||
      text.compare(0, prefix_text_.size(), prefix_text_) != 0) {
    return "";
  }
  std::string piece = text.substr(prefix_text_.size());
  emitted_ += piece;
  prefix_begin_ = read_end_;
  read_end_ = ids_.size();
  prefix_text_ = DecodeFrom(prefix_begin_, read_end_);
  return piece;
}

std::string IncrementalDetokenizer::Flush() {
  // The whole decode once, so that the pieces add up to it even where a window's decode was not
  // an extension of its prefix's.
  const std::string full = DecodeFrom(0, ids_.size());
  std::string piece;
  if (full.size() > emitted_.size() && full.compare(0, emitted_.size(), emitted_) == 0) {
    piece = full.substr(emitted_.size());
  }
  emitted_ += piece;
  prefix_begin_ = read_end_ = ids_.size();
  prefix_text_.clear();
  return piece;
}

}  // namespace afd::text

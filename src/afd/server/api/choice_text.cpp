#include "afd/server/api/choice_text.h"

#include <algorithm>

namespace afd::server::api {

ChoiceText::ChoiceText(const text::Tokenizer* tokenizer, std::vector<std::string> stop,
                       bool skip_special_tokens, bool include_stop)
    : stop_(std::move(stop)), include_stop_(include_stop) {
  if (tokenizer != nullptr) {
    detokenizer_ = std::make_unique<text::IncrementalDetokenizer>(*tokenizer, skip_special_tokens);
  }
  for (const auto& s : stop_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

void ChoiceText::MatchStop(size_t new_from) {
  size_t best = std::string::npos;
  for (const auto& s : stop_) {
    // A match must end after new_from (earlier text was already searched).
    const size_t from = new_from >= s.size() ? new_from - s.size() + 1 : 0;
    const size_t pos = text_.find(s, from);
    if (pos != std::string::npos && pos < best) {
      best = pos;
      stop_string_ = s;
    }
  }
  if (best != std::string::npos) text_.resize(best + (include_stop_ ? stop_string_.size() : 0));
}

std::string ChoiceText::Release(bool all) {
  size_t end = text_.size();
  if (!all && max_stop_len_ > 0) {
    end = end >= max_stop_len_ - 1 ? end - (max_stop_len_ - 1) : 0;
    // Back to a character start: continuation bytes are 10xxxxxx.
    while (end > released_ && end < text_.size() &&
           (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) {
      --end;
    }
  }
  if (end <= released_) return "";
  std::string piece = text_.substr(released_, end - released_);
  released_ = end;
  return piece;
}

std::string ChoiceText::Add(int32_t id) {
  if (detokenizer_ == nullptr || stopped()) return "";
  const size_t old_size = text_.size();
  text_ += detokenizer_->Add(static_cast<uint32_t>(id));
  if (text_.size() > old_size) MatchStop(old_size);
  return Release(stopped());
}

std::string ChoiceText::Finish() {
  if (detokenizer_ == nullptr || stopped()) return "";
  const size_t old_size = text_.size();
  text_ += detokenizer_->Flush();
  if (text_.size() > old_size) MatchStop(old_size);
  return Release(true);
}

}  // namespace afd::server::api

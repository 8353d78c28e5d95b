#include "afd/text/tokenizer/added_vocabulary.h"

#include <utf8proc.h>

#include <algorithm>

#include "afd/common/error.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text {

namespace {

// Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, join controls.
bool IsWordChar(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// The code point that ends s[0, end).
char32_t LastCodePoint(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  size_t len;
  return DecodeUtf8(s, b, &len);
}

}  // namespace

void AddedVocabulary::Matcher::Add(std::string pattern, size_t token) {
  if (pattern.empty()) return;
  by_first_byte[static_cast<unsigned char>(pattern[0])].push_back(patterns.size());
  patterns.push_back(std::move(pattern));
  token_index.push_back(token);
}

void AddedVocabulary::Matcher::Finish() {
  for (auto& bucket : by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t a, size_t b) { return patterns[a].size() > patterns[b].size(); });
  }
}

AddedVocabulary::AddedVocabulary(const nlohmann::json& tokens, const Normalizer* normalizer,
                                 const std::string& where)
    : normalizer_(normalizer) {
  if (tokens.is_null()) return;
  AFD_CHECK(tokens.is_array(), "{}: expected an array", where);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& t = tokens[i];
    const std::string w = fmt::format("{}[{}]", where, i);
    AFD_CHECK(t.is_object() && t.contains("id") && t.contains("content"),
              "{}: expected an object with id and content", w);
    AddedToken token;
    token.id = t["id"].get<uint32_t>();
    token.content = t["content"].get<std::string>();
    token.single_word = t.value("single_word", false);
    token.lstrip = t.value("lstrip", false);
    token.rstrip = t.value("rstrip", false);
    token.normalized = t.value("normalized", false);
    token.special = t.value("special", false);
    by_id_[token.id] = tokens_.size();
    by_content_[token.content] = token.id;
    tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.normalized) {
      normalized_.Add(normalizer_ ? normalizer_->Normalize(t.content) : t.content, i);
    } else {
      raw_.Add(t.content, i);
    }
  }
  raw_.Finish();
  normalized_.Finish();
}

const AddedToken* AddedVocabulary::FindById(uint32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<uint32_t> AddedVocabulary::FindByContent(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

void AddedVocabulary::SplitWith(const Matcher& matcher, TextSegment segment,
                                std::vector<TextSegment>* out) const {
  const std::string& s = segment.text;
  size_t start_offset = 0;
  auto emit_text = [&](size_t b, size_t e) {
    if (e == b) return;  // empty splits are dropped, as in HF's PreTokenizedString::split
    out->push_back({s.substr(b, e - b), std::nullopt, segment.at_start && b == 0});
  };
  size_t pos = 0;
  while (pos < s.size()) {
    // Leftmost-longest: the first position with a match, its longest pattern.
    const auto& bucket = matcher.by_first_byte[static_cast<unsigned char>(s[pos])];
    const std::string* found = nullptr;
    size_t token = 0;
    for (size_t p : bucket) {
      const std::string& pat = matcher.patterns[p];
      if (s.compare(pos, pat.size(), pat) == 0) {
        found = &pat;
        token = matcher.token_index[p];
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + found->size();
    pos = stop;  // the search resumes after this match even when it is discarded
    const AddedToken& t = tokens_[token];
    if (t.single_word) {
      const bool start_space = start == 0 || !IsWordChar(LastCodePoint(s, start));
      size_t len;
      const bool stop_space = stop == s.size() || !IsWordChar(DecodeUtf8(s, stop, &len));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t cb = b - 1;
        while (cb > 0 && (static_cast<unsigned char>(s[cb]) & 0xC0) == 0x80) --cb;
        size_t len;
        if (!IsWhitespace(DecodeUtf8(s, cb, &len))) break;
        b = cb;
      }
      start = std::max(b, start_offset);
    }
    if (t.rstrip) {
      size_t len;
      while (stop < s.size() && IsWhitespace(DecodeUtf8(s, stop, &len))) stop += len;
      pos = stop;
    }
    if (start_offset < start) emit_text(start_offset, start);
    out->push_back({s.substr(start, stop - start), t.id, segment.at_start && start == 0});
    start_offset = stop;
  }
  emit_text(start_offset, s.size());
}

std::vector<TextSegment> AddedVocabulary::Split(const std::string& text) const {
  std::vector<TextSegment> first;
  SplitWith(raw_, {text, std::nullopt, true}, &first);
  std::vector<TextSegment> out;
  for (TextSegment& seg : first) {
    if (seg.id) {
      out.push_back(std::move(seg));
      continue;
    }
    if (normalizer_) seg.text = normalizer_->Normalize(seg.text);
    SplitWith(normalized_, std::move(seg), &out);
  }
  return out;
}

}  // namespace afd::text

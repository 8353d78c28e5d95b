// A compiled Unicode regular expression (PCRE2, UTF + UCP, JIT when available) with the semantics
// of the Oniguruma engine HF tokenizers uses for the patterns tokenizer.json files contain:
// \p{..} classes, lookahead, \s/\S matching Unicode White_Space (PCRE2 10.42's \s leaves out
// U+0085) and \w/\W matching letters, marks, numbers and connector punctuation; the pattern is
// rewritten to get those.
//
// Thread safety: FindAll may be called from several threads (match data is per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace afd::text {

class Regex {
 public:
  // Throws afd::Error naming `what` and the pattern when it does not compile.
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match of the pattern in s, left to right, as [begin, end) byte offsets.
  // After an empty match the search resumes one character further (as Oniguruma's find_iter).
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view s) const;

  // Quotes every metacharacter of `literal` so that the pattern matches it verbatim.
  static std::string Escape(std::string_view literal);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace afd::text

#include "afd/text/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "afd/common/error.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text {

namespace {

// Oniguruma's Unicode \w: letters, marks, numbers, connector punctuation (PCRE2 10.42's leaves
// out marks and connectors other than '_').
constexpr const char* kWordClass = "\\p{L}\\p{M}\\p{N}\\p{Pc}";

// \s -> [\s\x{85}] (in a class: \s\x{85}), \S -> [^\s\x{85}], \w -> [kWordClass],
// \W -> [^kWordClass]; the rest is copied unchanged.
std::string RewriteWhitespaceClasses(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      ++i;
      if (n == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else if (n == 'w') {
        out += in_class ? kWordClass : std::string("[") + kWordClass + "]";
      } else if (n == 'W' && !in_class) {
        out += std::string("[^") + kWordClass + "]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
};

Regex::Regex(const std::string& pattern, const std::string& what) : impl_(new Impl) {
  const std::string rewritten = RewriteWhitespaceClasses(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code,
                              &error_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    AFD_THROW("{}: cannot compile regex {:?} at offset {}: {}", what, pattern, error_offset,
              reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
}

Regex::~Regex() { pcre2_code_free(impl_->code); }

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    // The input is valid UTF-8 (the tokenizer only passes str data), so skip PCRE2's check.
    const int rc =
        pcre2_match(impl_->code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) {
      if (rc == PCRE2_ERROR_NOMATCH) break;
      pcre2_match_data_free(md);
      AFD_THROW("regex match failed with PCRE2 error {}", rc);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    matches.emplace_back(ov[0], ov[1]);
    if (ov[1] > ov[0]) {
      start = ov[1];
    } else {
      if (ov[1] >= s.size()) break;
      size_t len;
      DecodeUtf8(s, ov[1], &len);
      start = ov[1] + len;
    }
  }
  pcre2_match_data_free(md);
  return matches;
}

std::string Regex::Escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ \t\n").find(c) != std::string_view::npos) {
      if (c == '\t') {
        out += "\\t";
        continue;
      }
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += '\\';
    }
    out += c;
  }
  return out;
}

}  // namespace afd::text

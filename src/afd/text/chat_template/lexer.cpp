#include "afd/text/chat_template/lexer.h"

#include <cctype>

#include "afd/common/error.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text::chat_template {

namespace {

std::string NormalizeNewlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> Run() {
    bool line_starting = true;  // the previous tag's match ended with a newline (or none yet)
    size_t pos = 0;
    while (pos < s_.size()) {
      const size_t open = FindOpen(pos);
      std::string text = s_.substr(pos, open - pos);
      if (open == s_.size()) {
        Text(text, pos);
        break;
      }
      const char kind = s_[open + 1];  // '{', '%' or '#'
      const char mod = open + 2 < s_.size() ? s_[open + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
          text.pop_back();
        }
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: drop spaces/tabs between the line start and the tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          if (text.find_first_not_of(" \t", l_pos) == std::string::npos) text.resize(l_pos);
        }
      }
      Text(text, pos);
      size_t body = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = s_.find("#}", body);
        AFD_CHECK(close != std::string::npos, "chat template line {}: unterminated comment",
                  LineAt(open));
        pos = AfterClose(close, close > body && s_[close - 1] == '-', true, &line_starting);
        continue;
      }
      if (kind == '%' && IsRaw(body)) {
        pos = LexRaw(open, body, &line_starting);
        continue;
      }
      tokens_.push_back(
          {kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", LineAt(open)});
      pos = LexExpression(body, kind == '{' ? '}' : '%', &line_starting);
    }
    tokens_.push_back({Token::Type::kEnd, "", LineAt(s_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    while (line_pos_ < pos && line_pos_ < s_.size()) {
      if (s_[line_pos_++] == '\n') ++line_;
    }
    return line_;
  }

  size_t FindOpen(size_t pos) const {
    for (size_t p = s_.find('{', pos); p != std::string::npos; p = s_.find('{', p + 1)) {
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) {
        return p;
      }
    }
    return s_.size();
  }

  void Text(const std::string& text, size_t pos) {
    if (!text.empty()) tokens_.push_back({Token::Type::kText, text, LineAt(pos)});
  }

  // Position after a closing tag at `close` (2 chars); applies `-` (strip following whitespace)
  // or trim_blocks (one newline after a block or comment, unless `+`).
  size_t AfterClose(size_t close, bool strip, bool is_block, bool* line_starting) {
    size_t p = close + 2;
    if (strip) {
      while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
    } else if (is_block && !(close > 0 && s_[close - 1] == '+') && p < s_.size() && s_[p] == '\n') {
      ++p;
    }
    *line_starting = p > 0 && s_[p - 1] == '\n';
    return p;
  }

  bool IsRaw(size_t body) const {
    size_t p = body;
    while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0;
  }

  size_t LexRaw(size_t open, size_t body, bool* line_starting) {
    const size_t close = s_.find("%}", body);
    size_t p = AfterClose(close, s_[close - 1] == '-', true, line_starting);
    for (size_t q = s_.find("{%", p); q != std::string::npos; q = s_.find("{%", q + 1)) {
      size_t r = q + 2;
      const bool strip_before = r < s_.size() && s_[r] == '-';
      if (strip_before || (r < s_.size() && s_[r] == '+')) ++r;
      while (r < s_.size() && std::isspace(static_cast<unsigned char>(s_[r]))) ++r;
      if (s_.compare(r, 6, "endraw") != 0) continue;
      std::string text = s_.substr(p, q - p);
      if (strip_before) {
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
          text.pop_back();
        }
      }
      Text(text, p);
      const size_t end_close = s_.find("%}", r);
      AFD_CHECK(end_close != std::string::npos, "chat template line {}: unterminated endraw",
                LineAt(q));
      return AfterClose(end_close, s_[end_close - 1] == '-', true, line_starting);
    }
    AFD_THROW("chat template line {}: {{% raw %}} without {{% endraw %}}", LineAt(open));
  }

  size_t LexExpression(size_t p, char close_char, bool* line_starting) {
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                 "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                 "|",  "(",  ")",  "[",  "]",  "{",  "}"};
    int depth = 0;  // brackets, so that `}` inside a dict literal does not close a {{ tag
    while (true) {
      while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
      AFD_CHECK(p < s_.size(), "chat template line {}: unterminated tag", line_);
      const int line = LineAt(p);
      // Closing: [-|+]}} or [-|+]%}
      for (int m = 0; m < 2; ++m) {
        const size_t q = p + m;
        if (m == 1 && s_[p] != '-' && s_[p] != '+') break;
        if (depth == 0 && q + 1 < s_.size() && s_[q] == close_char && s_[q + 1] == '}') {
          tokens_.push_back(
              {close_char == '}' ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", line});
          return AfterClose(q, m == 1 && s_[p] == '-', close_char == '%', line_starting);
        }
      }
      const char c = s_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) {
          ++e;
        }
        tokens_.push_back({Token::Type::kName, s_.substr(p, e - p), line});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
        if (e + 1 < s_.size() && s_[e] == '.' &&
            std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
        }
        if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {  // 1e3, 2.5e-4
          size_t x = e + 1;
          if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
          if (x < s_.size() && std::isdigit(static_cast<unsigned char>(s_[x]))) {
            is_float = true;
            e = x;
            while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t i = p; i < e; ++i) {
          if (s_[i] != '_') num += s_[i];
        }
        tokens_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInt, num, line});
        p = e;
      } else if (c == '"' || c == '\'') {
        p = LexString(p, line);
      } else {
        bool matched = false;
        for (const char* op : kOps) {
          const size_t n = std::char_traits<char>::length(op);
          if (s_.compare(p, n, op) == 0) {
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
            if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
            tokens_.push_back({Token::Type::kOperator, op, line});
            p += n;
            matched = true;
            break;
          }
        }
        AFD_CHECK(matched, "chat template line {}: unexpected character '{}'", line, c);
      }
    }
  }

  // A string literal, unescaped as Python's unicode-escape codec does (which Jinja2 uses).
  size_t LexString(size_t p, int line) {
    const char quote = s_[p++];
    std::string value;
    auto hex = [&](size_t at, size_t n, char32_t* cp) {
      if (at + n > s_.size()) return false;
      *cp = 0;
      for (size_t k = 0; k < n; ++k) {
        const char c = s_[at + k];
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
        *cp = *cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(c))
                                                   ? c - '0'
                                                   : std::tolower(c) - 'a' + 10);
      }
      return true;
    };
    while (p < s_.size() && s_[p] != quote) {
      if (s_[p] != '\\' || p + 1 >= s_.size()) {
        value += s_[p++];
        continue;
      }
      const char e = s_[++p];
      ++p;
      char32_t cp;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          AFD_CHECK(hex(p, n, &cp) && cp <= 0x10FFFF,
                    "chat template line {}: bad \\{} escape in a string", line, e);
          AppendUtf8(cp, &value);
          p += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < s_.size() && s_[p] >= '0' && s_[p] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(s_[p++] - '0');
            }
            AppendUtf8(cp, &value);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    AFD_CHECK(p < s_.size(), "chat template line {}: unterminated string", line);
    tokens_.push_back({Token::Type::kString, value, line});
    return p + 1;
  }

  std::string s_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> Lex(const std::string& source) { return Lexer(NormalizeNewlines(source)).Run(); }

}  // namespace afd::text::chat_template

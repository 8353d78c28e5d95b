#include "afd/text/tokenizer/utf8.h"

#include <utf8proc.h>

namespace afd::text {

namespace {

// Length of the valid UTF-8 sequence at s[pos], or 0 if invalid; *complete is false when the
// bytes so far are a valid prefix cut off by the end of s (then the return value is 0).
size_t ValidSequenceLength(std::string_view s, size_t pos, bool* truncated) {
  *truncated = false;
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    if (pos + i >= s.size()) {
      *truncated = true;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[pos + i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
  }
  return need;
}

// Bytes of the maximal invalid subpart at s[pos] (at least 1).
size_t InvalidSubpartLength(std::string_view s, size_t pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t i = 1;
  for (; i < need && pos + i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[pos + i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return i;
}

}  // namespace

char32_t DecodeUtf8(std::string_view s, size_t pos, size_t* len) {
  bool truncated;
  const size_t n = ValidSequenceLength(s, pos, &truncated);
  if (n == 0) {
    *len = 1;
    return 0xFFFD;
  }
  *len = n;
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (n == 1) return b0;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(char32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

std::vector<char32_t> ToCodePoints(std::string_view s) {
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0, len; pos < s.size(); pos += len) cps.push_back(DecodeUtf8(s, pos, &len));
  return cps;
}

size_t CompleteUtf8Prefix(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    bool truncated;
    const size_t n = ValidSequenceLength(s, pos, &truncated);
    if (truncated) return pos;
    pos += n == 0 ? InvalidSubpartLength(s, pos) : n;
  }
  return pos;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool truncated;
    const size_t n = ValidSequenceLength(bytes, pos, &truncated);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out += "\xEF\xBF\xBD";
      pos += InvalidSubpartLength(bytes, pos);
    }
  }
  return out;
}

bool IsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsNumeric(char32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsAlphanumeric(char32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return IsNumeric(cp);
  }
}

}  // namespace afd::text

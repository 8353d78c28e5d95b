#include "afd/text/tokenizer/byte_level.h"

#include "afd/text/tokenizer/utf8.h"

namespace afd::text {

namespace {

struct Tables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 0x144> to_byte;  // code point -> byte, -1 when unmapped

  Tables() {
    to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : 0x100 + next++;
      to_unicode[b] = EncodeUtf8(cp);
      to_byte[cp] = b;
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() { return GetTables().to_unicode; }

std::string BytesToUnicode(std::string_view s) {
  const auto& table = GetTables().to_unicode;
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) out += table[c];
  return out;
}

bool UnicodeToBytes(std::string_view token, std::string* out) {
  const auto& to_byte = GetTables().to_byte;
  for (size_t pos = 0, len; pos < token.size(); pos += len) {
    const char32_t cp = DecodeUtf8(token, pos, &len);
    if (cp >= to_byte.size() || to_byte[cp] < 0) return false;
    out->push_back(static_cast<char>(to_byte[cp]));
  }
  return true;
}

}  // namespace afd::text

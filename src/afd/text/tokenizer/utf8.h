// UTF-8 helpers shared by the tokenizer components. Strings are UTF-8 byte strings throughout;
// code points are char32_t.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace afd::text {

// Decodes the code point starting at s[pos] and sets *len to its byte length. Invalid or
// truncated sequences decode as U+FFFD with *len = 1.
char32_t DecodeUtf8(std::string_view s, size_t pos, size_t* len);

// Appends the UTF-8 encoding of cp.
void AppendUtf8(char32_t cp, std::string* out);
std::string EncodeUtf8(char32_t cp);

// The code points of s (invalid bytes as U+FFFD).
std::vector<char32_t> ToCodePoints(std::string_view s);

// Length of the longest prefix of s that ends on a code point boundary and does not end in an
// incomplete (but so far valid) multi-byte sequence: bytes after it may still complete a character.
size_t CompleteUtf8Prefix(std::string_view s);

// Converts bytes to valid UTF-8 as Rust's String::from_utf8_lossy does: each maximal invalid
// subpart becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Unicode classes used by the components (Rust's char:: methods).
bool IsWhitespace(char32_t cp);    // White_Space property
bool IsAlphanumeric(char32_t cp);  // Alphabetic or Numeric (L*, Nl, Nd, No, Other_Alphabetic)
bool IsNumeric(char32_t cp);       // Nd, Nl, No

}  // namespace afd::text

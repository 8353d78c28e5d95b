// GPT-2's reversible byte <-> printable character map used by the ByteLevel pre-tokenizer and
// decoder: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace afd::text {

// The UTF-8 encoding of the character byte b maps to.
const std::array<std::string, 256>& ByteToUnicode();

// Maps every byte of s to its character.
std::string BytesToUnicode(std::string_view s);

// Reverses BytesToUnicode for one token; returns false (and leaves *out partly written) when a
// character of `token` is not in the map.
bool UnicodeToBytes(std::string_view token, std::string* out);

}  // namespace afd::text

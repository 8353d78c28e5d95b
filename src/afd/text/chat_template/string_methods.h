// Python str semantics on UTF-8 strings for the chat-template interpreter: the string methods
// templates call (`s.split(...)`, `s.strip()`, ...) and the helpers filters share with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "afd/text/chat_template/value.h"

namespace afd::text::chat_template {

// Python's str.isspace() characters.
bool PySpace(char32_t c);
// Per-code-point lower/upper case (simple case mapping).
std::string MapCase(const std::string& s, bool upper);
std::string Capitalize(const std::string& s);
std::string Title(const std::string& s);
// str.strip/lstrip/rstrip; chars null = whitespace.
std::string StripChars(const std::string& s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit); sep none/undefined = runs of whitespace; maxsplit < 0 = no limit.
std::vector<Value> PySplit(const std::string& s, const Value& sep, int64_t maxsplit);
// str.replace(old, new, count); count < 0 = all.
std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count);
// Python's printf-style `fmt % args` (the format filter and the % operator on strings):
// %s %r %d %i %f %F %e %g %x %o %c %% with flags, width and precision.
std::string PercentFormat(const std::string& fmt, const std::vector<Value>& args);

// The bound method `s.name`, or undefined when str has no such method here.
Value StringMethod(const std::string& s, const std::string& name);

}  // namespace afd::text::chat_template

#include "afd/text/chat_template/string_methods.h"

#include <fmt/printf.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <string_view>

#include "afd/common/error.h"
#include "afd/text/chat_template/builtins.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text::chat_template {

bool PySpace(char32_t c) { return IsWhitespace(c) || (c >= 0x1C && c <= 0x1F); }

std::string MapCase(const std::string& s, bool upper) {
  std::string out;
  for (size_t pos = 0, len; pos < s.size(); pos += len) {
    const auto cp = static_cast<utf8proc_int32_t>(DecodeUtf8(s, pos, &len));
    AppendUtf8(static_cast<char32_t>(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp)), &out);
  }
  return out;
}

std::string Capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t len;
  DecodeUtf8(s, 0, &len);
  return MapCase(s.substr(0, len), true) + MapCase(s.substr(len), false);
}

std::string Title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t pos = 0, len; pos < s.size(); pos += len) {
    const char32_t cp = DecodeUtf8(s, pos, &len);
    const bool cased = IsAlphanumeric(cp);
    out += MapCase(s.substr(pos, len), !prev_cased);
    prev_cased = cased;
  }
  return out;
}

std::string StripChars(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<char32_t> cps = ToCodePoints(s);
  const std::vector<char32_t> set = chars ? ToCodePoints(*chars) : std::vector<char32_t>{};
  auto strip = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : PySpace(c);
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) AppendUtf8(cps[i], &out);
  return out;
}

std::vector<Value> PySplit(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<Value> parts;
  if (sep.is_none() || sep.is_undefined()) {  // runs of whitespace, no empty parts
    size_t pos = 0;
    while (true) {
      size_t len;
      while (pos < s.size() && PySpace(DecodeUtf8(s, pos, &len))) pos += len;
      if (pos >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        std::string rest = s.substr(pos);
        parts.emplace_back(StripChars(rest, nullptr, false, true));
        break;
      }
      size_t end = pos;
      while (end < s.size() && !PySpace(DecodeUtf8(s, end, &len))) end += len;
      parts.emplace_back(s.substr(pos, end - pos));
      pos = end;
    }
    return parts;
  }
  AFD_CHECK(sep.is_string() && !sep.as_string().empty(), "split: empty or non-string separator");
  const std::string& d = sep.as_string();
  size_t pos = 0;
  while (true) {
    const size_t f = s.find(d, pos);
    if (f == std::string::npos ||
        (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
      parts.emplace_back(s.substr(pos));
      break;
    }
    parts.emplace_back(s.substr(pos, f - pos));
    pos = f + d.size();
  }
  return parts;
}

std::string PyReplace(const std::string& s, const std::string& from, const std::string& to,
                      int64_t count) {
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  if (from.empty()) {  // Python inserts `to` between characters
    for (size_t p = 0, len; p <= s.size(); p += len) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (p == s.size()) break;
      DecodeUtf8(s, p, &len);
      out.append(s, p, len);
    }
    return out;
  }
  while (true) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos || (count >= 0 && n >= count)) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++n;
  }
  return out + s.substr(pos);
}

std::string PercentFormat(const std::string& fmt, const std::vector<Value>& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < fmt.size() && std::string_view("-+ #0").find(fmt[j]) != std::string_view::npos) {
      spec += fmt[j++];
    }
    while (j < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[j])) || fmt[j] == '.')) {
      spec += fmt[j++];
    }
    AFD_CHECK(j < fmt.size(), "incomplete format");
    const char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    AFD_CHECK(next < args.size(), "not enough arguments for format string");
    const Value& a = args[next++];
    switch (conv) {
      case 's':
      case 'r': {
        const std::string text = conv == 's' ? a.Str() : a.Repr();
        out += fmt::sprintf(spec + "s", text);
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
        AFD_CHECK(a.is_number() || a.is_bool(), "%{} format: a number is required", conv);
        out += fmt::sprintf(spec + (conv == 'i' ? 'd' : conv), static_cast<long long>(a.as_int()));
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        AFD_CHECK(a.is_number() || a.is_bool(), "%{} format: a number is required", conv);
        out += fmt::sprintf(spec + conv, a.as_double());
        break;
      case 'c':
        out += a.is_string() ? a.as_string() : EncodeUtf8(static_cast<char32_t>(a.as_int()));
        break;
      default:
        AFD_THROW("unsupported format character '{}'", conv);
    }
  }
  AFD_CHECK(next == args.size(), "not all arguments converted during string formatting");
  return out;
}

namespace {

bool PrefixTest(const std::string& s, const Value& arg, bool suffix) {
  std::vector<Value> options = arg.is_list() ? arg.list() : std::vector<Value>{arg};
  for (const Value& o : options) {
    AFD_CHECK(o.is_string(), "{}: expected a string", suffix ? "endswith" : "startswith");
    const std::string& p = o.as_string();
    if (p.size() > s.size()) continue;
    if (suffix ? s.compare(s.size() - p.size(), p.size(), p) == 0
               : s.compare(0, p.size(), p) == 0) {
      return true;
    }
  }
  return false;
}

Value Bind(std::function<Value(Args&)> f) { return Value::MakeFunction(std::move(f)); }

}  // namespace

Value StringMethod(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    const bool suffix = name == "endswith";
    return Bind([s, suffix](Args& a) { return Value(PrefixTest(s, Arg(a, 0, "prefix"), suffix)); });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return Bind([s, left, right](Args& a) {
      const Value chars = Arg(a, 0, "chars", Value::None());
      const std::string c = chars.is_string() ? chars.as_string() : "";
      return Value(StripChars(s, chars.is_string() ? &c : nullptr, left, right));
    });
  }
  if (name == "split") {
    return Bind([s](Args& a) {
      return Value::List(
          PySplit(s, Arg(a, 0, "sep", Value::None()), Arg(a, 1, "maxsplit", Value(-1)).as_int()));
    });
  }
  if (name == "replace") {
    return Bind([s](Args& a) {
      const Value from = Arg(a, 0, "old"), to = Arg(a, 1, "new");
      AFD_CHECK(from.is_string() && to.is_string(), "replace: expected two strings");
      return Value(
          PyReplace(s, from.as_string(), to.as_string(), Arg(a, 2, "count", Value(-1)).as_int()));
    });
  }
  if (name == "upper" || name == "lower") {
    const bool up = name == "upper";
    return Bind([s, up](Args&) { return Value(MapCase(s, up)); });
  }
  if (name == "title") return Bind([s](Args&) { return Value(Title(s)); });
  if (name == "capitalize") return Bind([s](Args&) { return Value(Capitalize(s)); });
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return Bind([s, find](Args& a) {
      const Value sub = Arg(a, 0, "sub");
      AFD_CHECK(sub.is_string(), "expected a string argument");
      if (find) {
        const size_t f = s.find(sub.as_string());
        return Value(f == std::string::npos
                         ? int64_t{-1}
                         : static_cast<int64_t>(ToCodePoints(s.substr(0, f)).size()));
      }
      int64_t n = 0;
      if (sub.as_string().empty()) return Value(static_cast<int64_t>(ToCodePoints(s).size()) + 1);
      for (size_t p = s.find(sub.as_string()); p != std::string::npos;
           p = s.find(sub.as_string(), p + sub.as_string().size()))
        ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return Bind([s](Args& a) {
      std::string out;
      const std::vector<Value> items = Arg(a, 0, "iterable").Iterate();
      for (size_t i = 0; i < items.size(); ++i) out += (i ? s : "") + items[i].Str();
      return Value(out);
    });
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    return Bind([s, name](Args&) {
      if (s.empty()) return Value(false);
      for (char32_t c : ToCodePoints(s)) {
        const bool ok = name == "isspace"   ? PySpace(c)
                        : name == "isdigit" ? (c >= '0' && c <= '9')
                        : name == "isalpha" ? (IsAlphanumeric(c) && !IsNumeric(c))
                                            : IsAlphanumeric(c);
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return Value();
}
}  // namespace afd::text::chat_template

// How values print: Python str()/repr() and json.dumps (the tojson filter).
#include <algorithm>
#include <charconv>
#include <cmath>

#include "afd/common/error.h"
#include "afd/text/chat_template/value.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text::chat_template {

std::string Value::FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, then Python's layout: exponent form when exp < -4 or >= 16.
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  if (exp < -4 || exp >= 16) {
    std::string m(1, digits[0]);
    if (digits.size() > 1) {
      m += '.';
      m.append(digits, 1, std::string::npos);
    }
    return fmt::format("{}{}e{}{:02d}", sign, m, exp < 0 ? '-' : '+', std::abs(exp));
  }
  std::string out;
  if (exp < 0) {
    out = "0.";
    out.append(static_cast<size_t>(-exp - 1), '0');
    out += digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out = digits;
    out.append(exp + 1 - digits.size(), '0');
    out += ".0";
  } else {
    out.assign(digits, 0, static_cast<size_t>(exp) + 1);
    out += '.';
    out.append(digits, static_cast<size_t>(exp) + 1, std::string::npos);
  }
  return sign + out;
}

namespace {

std::string PyStringRepr(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t pos = 0, len; pos < s.size(); pos += len) {
    const char32_t cp = DecodeUtf8(s, pos, &len);
    if (cp == static_cast<char32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else {
      out.append(s, pos, len);
    }
  }
  return out + q;
}

// A JSON string as json.dumps writes it: ensure_ascii escapes all but printable ASCII (UTF-16
// surrogate pairs above the BMP); otherwise only quotes, backslashes and control characters.
void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t pos = 0, len; pos < s.size(); pos += len) {
    const char32_t c = DecodeUtf8(s, pos, &len);
    switch (c) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c > 0xFFFF) {
        const char32_t v = c - 0x10000;
        *out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        *out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      }
    } else {
      out->append(s, pos, len);
    }
  }
  *out += '"';
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FloatRepr(d_);
    case Kind::kString:
      return s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kString:
      return PyStringRepr(s_);
    case Kind::kList: {
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].Repr();
      if (b_ && list_->size() == 1) out += ",";
      return out + (b_ ? ")" : "]");
    }
    case Kind::kDict: {
      if (dict_->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        out += (i ? ", " : "") + PyStringRepr(dict_->items[i].first) + ": " +
               dict_->items[i].second.Repr();
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function>";
    default:
      return Str();
  }
}

void Value::ToJsonImpl(const JsonOptions& o, int depth, std::string* out) const {
  auto newline = [&](int d) {
    if (!o.pretty) return;
    *out += "\n";
    for (int i = 0; i < d; ++i) *out += o.indent;
  };
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      *out += "null";
      return;
    case Kind::kBool:
      *out += b_ ? "true" : "false";
      return;
    case Kind::kInt:
      *out += std::to_string(i_);
      return;
    case Kind::kFloat:
      *out += std::isnan(d_)   ? "NaN"
              : std::isinf(d_) ? (d_ > 0 ? "Infinity" : "-Infinity")
                               : FloatRepr(d_);
      return;
    case Kind::kString:
      JsonString(s_, o.ensure_ascii, out);
      return;
    case Kind::kList: {
      if (list_->empty()) {
        *out += "[]";
        return;
      }
      *out += "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) *out += o.item_sep;
        newline(depth + 1);
        (*list_)[i].ToJsonImpl(o, depth + 1, out);
      }
      newline(depth);
      *out += "]";
      return;
    }
    case Kind::kDict: {
      if (dict_->items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : dict_->items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += o.item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, o.ensure_ascii, out);
        *out += o.key_sep;
        items[i]->second.ToJsonImpl(o, depth + 1, out);
      }
      newline(depth);
      *out += "}";
      return;
    }
    case Kind::kFunction:
      AFD_THROW("a function is not JSON serializable");
  }
}

std::string Value::ToJson(const JsonOptions& options) const {
  std::string out;
  ToJsonImpl(options, 0, &out);
  return out;
}

}  // namespace afd::text::chat_template

#include "afd/server/chat_template/builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "afd/common/error.h"
#include "afd/server/tokenizer/utf8.h"

namespace afd::server::jinja {

namespace {

// Argument `index` (or keyword `name`), or `fallback` when absent.
Value Arg(const Args& args, size_t index, const char* name, Value fallback = Value()) {
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return v;
  }
  return index < args.positional.size() ? args.positional[index] : fallback;
}

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

std::vector<Value> Split(const std::string& s, const Value& sep, int64_t maxsplit) {
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

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
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
          Split(s, Arg(a, 0, "sep", Value::None()), Arg(a, 1, "maxsplit", Value(-1)).as_int()));
    });
  }
  if (name == "replace") {
    return Bind([s](Args& a) {
      const Value from = Arg(a, 0, "old"), to = Arg(a, 1, "new");
      AFD_CHECK(from.is_string() && to.is_string(), "replace: expected two strings");
      return Value(
          Replace(s, from.as_string(), to.as_string(), Arg(a, 2, "count", Value(-1)).as_int()));
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

Value DictMethod(const Value& d, const std::string& name) {
  if (name == "items") {
    return Bind([d](Args&) {
      std::vector<Value> items;
      for (const auto& [k, v] : d.dict().items) items.push_back(Value::List({Value(k), v}, true));
      return Value::List(std::move(items));
    });
  }
  if (name == "keys") return Bind([d](Args&) { return Value::List(d.Iterate()); });
  if (name == "values") {
    return Bind([d](Args&) {
      std::vector<Value> items;
      for (const auto& kv : d.dict().items) items.push_back(kv.second);
      return Value::List(std::move(items));
    });
  }
  if (name == "get") {
    return Bind([d](Args& a) {
      const Value key = Arg(a, 0, "key");
      const Value* v = key.is_string() ? d.dict().Find(key.as_string()) : nullptr;
      return v ? *v : Arg(a, 1, "default", Value::None());
    });
  }
  return Value();
}

// Attribute or item of `item` named by a dotted `attribute` ("a.b" or "0").
Value AttributeOf(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return GetItem(item, attribute);
  Value v = item;
  for (const Value& part : Split(attribute.Str(), Value("."), -1)) {
    const std::string& p = part.as_string();
    const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
    v = digits ? GetItem(v, Value(static_cast<int64_t>(std::stoll(p)))) : GetItem(v, Value(p));
  }
  return v;
}

int64_t Length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(ToCodePoints(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  if (v.is_undefined()) return 0;
  AFD_THROW("object of type {} has no len()", v.Repr());
}

// select/reject/selectattr/rejectattr.
Value SelectFilter(const Value& seq, Args& args, bool by_attr, bool keep) {
  std::vector<Value> out;
  const size_t first = by_attr ? 1 : 0;
  const Value attr = by_attr ? Arg(args, 0, "attribute") : Value();
  const Value test = first < args.positional.size() ? args.positional[first] : Value();
  Args test_args;
  for (size_t i = first + 1; i < args.positional.size(); ++i)
    test_args.positional.push_back(args.positional[i]);
  for (const Value& item : seq.Iterate()) {
    const Value v = by_attr ? AttributeOf(item, attr) : item;
    const bool pass = test.is_undefined() ? v.Truthy() : ApplyTest(test.Str(), v, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool LessForSort(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool()))
    return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  AFD_THROW("cannot compare {} and {}", a.Repr(), b.Repr());
}

}  // namespace

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

Value GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_dict()) {
    if (!obj.dict().is_namespace) {
      Value m = DictMethod(obj, name);
      if (!m.is_undefined()) return m;
    }
    const Value* v = obj.dict().Find(name);
    return v ? *v : Value();
  }
  if (obj.is_string()) return StringMethod(obj.as_string(), name);
  return Value();
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict().Find(key.as_string())) return *v;
      return obj.dict().is_namespace ? Value() : DictMethod(obj, key.as_string());
    }
    return Value();
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    const std::vector<Value> items = obj.is_list() ? obj.list() : obj.Iterate();
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(items.size());
    if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value();
    return items[static_cast<size_t>(i)];
  }
  if (obj.is_string() && key.is_string()) return StringMethod(obj.as_string(), key.as_string());
  return Value();
}

Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  AFD_CHECK(obj.is_list() || obj.is_string(), "cannot slice {}",
            obj.is_undefined() ? "an undefined value" : obj.Repr());
  const std::vector<Value> items = obj.Iterate();
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t st = step.is_none() ? 1 : step.as_int();
  AFD_CHECK(st != 0, "slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, st > 0 ? n : -1);
  std::vector<Value> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(items[static_cast<size_t>(i)]);
  if (obj.is_list()) return Value::List(std::move(out));
  std::string s;
  for (const Value& v : out) s += v.as_string();
  return Value(s);
}

bool ApplyTest(const std::string& name, const Value& v, Args& args) {
  const Value a0 = Arg(args, 0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_function();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "even" || name == "odd") {
    AFD_CHECK(v.is_int(), "test '{}' needs an integer", name);
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") return a0.as_int() != 0 && v.as_int() % a0.as_int() == 0;
  if (name == "eq" || name == "equalto" || name == "==") return v.Equals(a0);
  if (name == "ne" || name == "!=") return !v.Equals(a0);
  if (name == "sameas") return v.kind() == a0.kind() && v.Equals(a0);
  if (name == "lt" || name == "lessthan" || name == "<") return LessForSort(v, a0);
  if (name == "gt" || name == "greaterthan" || name == ">") return LessForSort(a0, v);
  if (name == "le" || name == "<=") return !LessForSort(a0, v);
  if (name == "ge" || name == ">=") return !LessForSort(v, a0);
  if (name == "in") {
    if (a0.is_string())
      return v.is_string() && a0.as_string().find(v.as_string()) != std::string::npos;
    if (a0.is_dict()) return v.is_string() && a0.dict().Find(v.as_string());
    for (const Value& x : a0.Iterate()) {
      if (x.Equals(v)) return true;
    }
    return false;
  }
  if (name == "lower" || name == "upper") {
    return v.is_string() && MapCase(v.as_string(), name == "upper") == v.as_string();
  }
  AFD_THROW("unknown test '{}'", name);
}

Value ApplyFilter(const std::string& name, const Value& v, Args& args) {
  if (name == "length" || name == "count") return Value(Length(v));
  if (name == "tojson") {
    const Value indent = Arg(args, 0, "indent", Value::None());
    return Value(v.ToJson(indent.is_none() ? -1 : static_cast<int>(indent.as_int()),
                          Arg(args, 3, "sort_keys", Value(false)).Truthy()));
  }
  if (name == "trim") {
    const Value chars = Arg(args, 0, "chars", Value::None());
    const std::string c = chars.is_string() ? chars.as_string() : "";
    return Value(StripChars(v.Str(), chars.is_string() ? &c : nullptr, true, true));
  }
  if (name == "lower" || name == "upper") return Value(MapCase(v.Str(), name == "upper"));
  if (name == "capitalize") return Value(Capitalize(v.Str()));
  if (name == "title") return Value(Title(v.Str()));
  if (name == "string") return Value(v.Str());
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value(HtmlEscape(v.Str()));
  if (name == "first" || name == "last") {
    const std::vector<Value> items = v.Iterate();
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "default" || name == "d") {
    const bool boolean = Arg(args, 1, "boolean", Value(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy()))
      return Arg(args, 0, "default_value", Value(""));
    return v;
  }
  if (name == "join") {
    const Value sep = Arg(args, 0, "d", Value(""));
    const Value attr = Arg(args, 1, "attribute", Value::None());
    std::string out;
    const std::vector<Value> items = v.Iterate();
    for (size_t i = 0; i < items.size(); ++i) {
      out += (i ? sep.Str() : "") + (attr.is_none() ? items[i] : AttributeOf(items[i], attr)).Str();
    }
    return Value(out);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::List();
    AFD_CHECK(v.is_dict(), "items: expected a mapping");
    Args none;
    return DictMethod(v, "items").function()(none);
  }
  if (name == "list") return Value::List(v.Iterate());
  if (name == "map") {
    std::vector<Value> out;
    const Value attr = Arg(args, 99, "attribute");
    if (!attr.is_undefined()) {
      const Value dflt = Arg(args, 99, "default");
      for (const Value& item : v.Iterate()) {
        Value x = AttributeOf(item, attr);
        out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
      }
      return Value::List(std::move(out));
    }
    AFD_CHECK(!args.positional.empty(), "map: give a filter name or attribute=");
    const std::string filter = args.positional[0].Str();
    Args rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& item : v.Iterate()) out.push_back(ApplyFilter(filter, item, rest));
    return Value::List(std::move(out));
  }
  if (name == "select") return SelectFilter(v, args, false, true);
  if (name == "reject") return SelectFilter(v, args, false, false);
  if (name == "selectattr") return SelectFilter(v, args, true, true);
  if (name == "rejectattr") return SelectFilter(v, args, true, false);
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<Value> chars = v.Iterate();
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
      return Value(out);
    }
    std::vector<Value> items = v.Iterate();
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "unique") {
    std::vector<Value> out;
    for (const Value& x : v.Iterate()) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return y.Equals(x); }))
        out.push_back(x);
    }
    return Value::List(std::move(out));
  }
  if (name == "sort" || name == "dictsort") {
    std::vector<Value> items =
        name == "dictsort" ? ApplyFilter("items", v, args).list() : v.Iterate();
    const bool reverse = Arg(args, name == "sort" ? 0 : 2, "reverse", Value(false)).Truthy();
    const Value attr =
        name == "sort" ? Arg(args, 2, "attribute", Value::None()) : Value(int64_t{0});
    auto key = [&](const Value& x) {
      Value k = attr.is_none() ? x : AttributeOf(x, attr);
      return k.is_string() ? Value(MapCase(k.as_string(), false)) : k;  // case-insensitive
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      return reverse ? LessForSort(key(b), key(a)) : LessForSort(key(a), key(b));
    });
    return Value::List(std::move(items));
  }
  if (name == "replace") {
    const Value from = Arg(args, 0, "old"), to = Arg(args, 1, "new");
    return Value(Replace(
        v.Str(), from.Str(), to.Str(),
        Arg(args, 2, "count", Value::None()).is_none() ? -1 : Arg(args, 2, "count").as_int()));
  }
  if (name == "int") {
    if (v.is_string()) {
      try {
        return Value(
            static_cast<int64_t>(std::stoll(StripChars(v.as_string(), nullptr, true, true))));
      } catch (const std::exception&) {
        return Arg(args, 0, "default", Value(int64_t{0}));
      }
    }
    return v.is_number() || v.is_bool() ? Value(v.as_int())
                                        : Arg(args, 0, "default", Value(int64_t{0}));
  }
  if (name == "float") {
    if (v.is_string()) {
      try {
        return Value(std::stod(v.as_string()));
      } catch (const std::exception&) {
        return Arg(args, 0, "default", Value(0.0));
      }
    }
    return v.is_number() || v.is_bool() ? Value(v.as_double())
                                        : Arg(args, 0, "default", Value(0.0));
  }
  if (name == "abs")
    return v.is_float() ? Value(std::fabs(v.as_double()))
                        : Value(static_cast<int64_t>(std::llabs(v.as_int())));
  if (name == "round") {
    const double p =
        std::pow(10.0, static_cast<double>(Arg(args, 0, "precision", Value(int64_t{0})).as_int()));
    return Value(std::round(v.as_double() * p) / p);
  }
  if (name == "sum") {
    const Value attr = Arg(args, 0, "attribute", Value::None());
    Value total = Arg(args, 1, "start", Value(int64_t{0}));
    for (const Value& x : v.Iterate()) {
      const Value y = attr.is_none() ? x : AttributeOf(x, attr);
      total = total.is_float() || y.is_float() ? Value(total.as_double() + y.as_double())
                                               : Value(total.as_int() + y.as_int());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    const std::vector<Value> items = v.Iterate();
    if (items.empty()) return Value();
    Value best = items[0];
    for (const Value& x : items) {
      if (name == "min" ? LessForSort(x, best) : LessForSort(best, x)) best = x;
    }
    return best;
  }
  if (name == "indent") {
    const Value w = Arg(args, 0, "width", Value(int64_t{4}));
    const std::string pad =
        w.is_string() ? w.as_string() : std::string(static_cast<size_t>(w.as_int()), ' ');
    const bool first = Arg(args, 1, "first", Value(false)).Truthy();
    const bool blank = Arg(args, 2, "blank", Value(false)).Truthy();
    const std::vector<Value> lines = Split(v.Str(), Value("\n"), -1);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i].as_string();
      if (i > 0) out += "\n";
      if ((i > 0 || first) && (blank || !l.empty())) out += pad;
      out += l;
    }
    return Value(out);
  }
  if (name == "wordcount")
    return Value(static_cast<int64_t>(Split(v.Str(), Value::None(), -1).size()));
  if (name == "attr") return GetAttr(v, Arg(args, 0, "name").Str());
  AFD_THROW("unknown filter '{}'", name);
}

void AddGlobalFunctions(Value* globals) {
  Dict& g = globals->dict();
  g.Set("range", Bind([](Args& a) {
          AFD_CHECK(!a.positional.empty() && a.positional.size() <= 3,
                    "range expects 1 to 3 arguments");
          int64_t start = 0, stop, step = 1;
          if (a.positional.size() == 1) {
            stop = a.positional[0].as_int();
          } else {
            start = a.positional[0].as_int();
            stop = a.positional[1].as_int();
            if (a.positional.size() == 3) step = a.positional[2].as_int();
          }
          AFD_CHECK(step != 0, "range step cannot be zero");
          std::vector<Value> out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
          return Value::List(std::move(out));
        }));
  g.Set("namespace", Bind([](Args& a) {
          Value ns = Value::MakeDict(/*is_namespace=*/true);
          for (const Value& p : a.positional) {
            AFD_CHECK(p.is_dict(), "namespace() takes mappings and keyword arguments");
            for (const auto& [k, x] : p.dict().items) ns.dict().Set(k, x);
          }
          for (auto& [k, x] : a.keyword) ns.dict().Set(k, x);
          return ns;
        }));
  g.Set("dict", Bind([](Args& a) {
          Value d = Value::MakeDict();
          for (auto& [k, x] : a.keyword) d.dict().Set(k, x);
          return d;
        }));
  g.Set("raise_exception", Bind([](Args& a) -> Value {
          AFD_THROW("raise_exception: the chat template refused the input: {}",
                    Arg(a, 0, "message").Str());
        }));
  g.Set("strftime_now", Bind([](Args& a) {
          const std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof(buf), Arg(a, 0, "format").Str().c_str(), &tm);
          return Value(std::string(buf, n));
        }));
}

}  // namespace afd::server::jinja

#include <fmt/printf.h>
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "afd/common/error.h"
#include "afd/text/chat_template/builtins.h"
#include "afd/text/chat_template/string_methods.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text::chat_template {

namespace {

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

}  // namespace

Value ApplyFilter(const std::string& name, const Value& v, Args& args) {
  if (name == "length" || name == "count") return Value(Length(v));
  if (name == "tojson") {  // transformers: tojson(x, ensure_ascii, indent, separators, sort_keys)
    JsonOptions o;
    o.ensure_ascii = Arg(args, 0, "ensure_ascii", Value(false)).Truthy();
    const Value indent = Arg(args, 1, "indent", Value::None());
    if (!indent.is_none()) {
      o.pretty = true;
      o.indent = indent.is_string()
                     ? indent.as_string()
                     : std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
    }
    o.item_sep = o.pretty ? "," : ", ";
    const Value separators = Arg(args, 2, "separators", Value::None());
    if (!separators.is_none()) {
      AFD_CHECK(separators.is_list() && separators.list().size() == 2,
                "tojson: separators must be an (item, key) pair");
      o.item_sep = separators.list()[0].Str();
      o.key_sep = separators.list()[1].Str();
    }
    o.sort_keys = Arg(args, 3, "sort_keys", Value(false)).Truthy();
    return Value(v.ToJson(o));
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
      return reverse ? SortLess(key(b), key(a)) : SortLess(key(a), key(b));
    });
    return Value::List(std::move(items));
  }
  if (name == "replace") {
    const Value from = Arg(args, 0, "old"), to = Arg(args, 1, "new");
    return Value(PyReplace(
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
  if (name == "round") {  // Jinja2: common = Python's round (half to even), floor, ceil
    const int64_t precision = Arg(args, 0, "precision", Value(int64_t{0})).as_int();
    const std::string method = Arg(args, 1, "method", Value("common")).Str();
    const double p = std::pow(10.0, static_cast<double>(precision));
    if (method == "floor") return Value(std::floor(v.as_double() * p) / p);
    if (method == "ceil") return Value(std::ceil(v.as_double() * p) / p);
    if (precision < 0) return Value(std::nearbyint(v.as_double() * p) / p);
    // printf rounds the exact binary value half-to-even, as Python's round does.
    return Value(std::stod(fmt::sprintf("%.*f", static_cast<int>(precision), v.as_double())));
  }
  if (name == "format") {
    std::vector<Value> values = args.positional;
    return Value(PercentFormat(v.Str(), values));
  }
  if (name == "center") {
    const int64_t width = Arg(args, 0, "width", Value(int64_t{80})).as_int();
    const std::string s = v.Str();
    const int64_t len = static_cast<int64_t>(ToCodePoints(s).size());
    if (width <= len) return Value(s);
    // Python's str.center: the extra space goes left when the padding and width are both odd.
    const int64_t pad = width - len;
    const int64_t left = pad / 2 + (pad & width & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + s +
                 std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (name == "batch") {
    const int64_t n = Arg(args, 0, "linecount").as_int();
    AFD_CHECK(n > 0, "batch: linecount must be positive");
    const Value fill = Arg(args, 1, "fill_with", Value::None());
    std::vector<Value> out;
    std::vector<Value> cur;
    for (const Value& x : v.Iterate()) {
      cur.push_back(x);
      if (static_cast<int64_t>(cur.size()) == n) {
        out.push_back(Value::List(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      while (!fill.is_none() && static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
      out.push_back(Value::List(std::move(cur)));
    }
    return Value::List(std::move(out));
  }
  if (name == "truncate") {
    const std::vector<char32_t> cps = ToCodePoints(v.Str());
    const int64_t length = Arg(args, 0, "length", Value(int64_t{255})).as_int();
    const bool killwords = Arg(args, 1, "killwords", Value(false)).Truthy();
    const std::string end = Arg(args, 2, "end", Value("...")).Str();
    const int64_t leeway = Arg(args, 3, "leeway", Value(int64_t{5})).as_int();
    if (static_cast<int64_t>(cps.size()) <= length + leeway) return Value(v.Str());
    const int64_t keep =
        std::max<int64_t>(0, length - static_cast<int64_t>(ToCodePoints(end).size()));
    std::string head;
    for (int64_t i = 0; i < keep; ++i) AppendUtf8(cps[static_cast<size_t>(i)], &head);
    if (!killwords) {  // drop the last, partial word (Python: rsplit(" ", 1)[0])
      const size_t sp = head.rfind(' ');
      if (sp != std::string::npos) head.resize(sp);
    }
    return Value(head + end);
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
      if (name == "min" ? SortLess(x, best) : SortLess(best, x)) best = x;
    }
    return best;
  }
  if (name == "indent") {
    const Value w = Arg(args, 0, "width", Value(int64_t{4}));
    const std::string pad =
        w.is_string() ? w.as_string() : std::string(static_cast<size_t>(w.as_int()), ' ');
    const bool first = Arg(args, 1, "first", Value(false)).Truthy();
    const bool blank = Arg(args, 2, "blank", Value(false)).Truthy();
    const std::vector<Value> lines = PySplit(v.Str(), Value("\n"), -1);
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
    return Value(static_cast<int64_t>(PySplit(v.Str(), Value::None(), -1).size()));
  if (name == "attr") return GetAttr(v, Arg(args, 0, "name").Str());
  AFD_THROW("unknown filter '{}'", name);
}
}  // namespace afd::text::chat_template

#include "afd/text/chat_template/builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "afd/common/error.h"
#include "afd/text/chat_template/string_methods.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text::chat_template {

namespace {

Value Bind(std::function<Value(Args&)> f) { return Value::MakeFunction(std::move(f)); }

}  // namespace

// Argument `index` (or keyword `name`), or `fallback` when absent.
Value Arg(const Args& args, size_t index, const char* name, Value fallback) {
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return v;
  }
  return index < args.positional.size() ? args.positional[index] : fallback;
}

bool SortLess(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool()))
    return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  AFD_THROW("cannot compare {} and {}", a.Repr(), b.Repr());
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
  for (const Value& part : PySplit(attribute.Str(), Value("."), -1)) {
    const std::string& p = part.as_string();
    const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
    v = digits ? GetItem(v, Value(static_cast<int64_t>(std::stoll(p)))) : GetItem(v, Value(p));
  }
  return v;
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
}  // namespace afd::text::chat_template

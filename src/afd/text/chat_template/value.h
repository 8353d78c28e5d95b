// The values of the chat-template interpreter, with Python/Jinja2 semantics: undefined, none,
// bool, int, float, string, list, dict (insertion-ordered, string keys), namespace (a dict whose
// attributes `set` may assign) and callables (macros and built-in functions). Lists, dicts and
// namespaces are shared by reference, as in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace afd::text::chat_template {

class Value;

// json.dumps options of the tojson filter (transformers' signature).
struct JsonOptions {
  bool pretty = false;   // indent given: newlines and `indent` per level
  std::string indent;    // per level (an int n is n spaces)
  std::string item_sep;  // default ", " (or "," when pretty)
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<Value(Args&)>;

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  Value* Find(const std::string& key);
  void Set(const std::string& key, Value value);
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value None();
  Value(bool b);                                    // NOLINT: implicit like Python literals
  Value(int64_t i);                                 // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d);                                  // NOLINT
  Value(std::string s);                             // NOLINT
  Value(const char* s) : Value(std::string(s)) {}   // NOLINT
  // A list; is_tuple only changes how it prints: (a, b) instead of [a, b].
  static Value List(std::vector<Value> items = {}, bool is_tuple = false);
  static Value MakeDict(bool is_namespace = false);
  static Value MakeFunction(Function f);
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float(); }  // bools are not numbers here
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return is_list() && b_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const {
    return is_bool() ? (b_ ? 1 : 0) : is_float() ? static_cast<int64_t>(d_) : i_;
  }
  double as_double() const { return is_float() ? d_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return s_; }
  std::vector<Value>& list() const { return *list_; }
  Dict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }

  bool Truthy() const;
  // Python str(): what {{ value }} prints (undefined prints nothing).
  std::string Str() const;
  // Python repr() (strings quoted), used inside printed lists and dicts.
  std::string Repr() const;
  // JSON as Python's json.dumps with `options` (transformers' tojson).
  std::string ToJson(const JsonOptions& options) const;
  // Python ==.
  bool Equals(const Value& other) const;
  // Items iterated by `for`: list items, dict keys, string characters.
  std::vector<Value> Iterate() const;

  // Python's repr of a float ("1.0", "1e+16", "0.1").
  static std::string FloatRepr(double d);

 private:
  void ToJsonImpl(const JsonOptions& o, int depth, std::string* out) const;

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;  // also: a list is a tuple
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<std::vector<Value>> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

}  // namespace afd::text::chat_template

#include "afd/text/chat_template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "afd/common/error.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text::chat_template {

Value* Dict::Find(const std::string& key) {
  for (auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value value) {
  if (Value* v = Find(key)) {
    *v = std::move(value);
  } else {
    items.emplace_back(key, std::move(value));
  }
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}

Value Value::List(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.b_ = is_tuple;
  v.list_ = std::make_shared<std::vector<Value>>(std::move(items));
  return v;
}

Value Value::MakeDict(bool is_namespace) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>();
  v.dict_->is_namespace = is_namespace;
  return v;
}

Value Value::MakeFunction(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value v = List();
      for (const auto& e : j) v.list().push_back(FromJson(e));
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = MakeDict();
      for (const auto& [k, e] : j.items()) v.dict().items.emplace_back(k, FromJson(e));
      return v;
    }
    default:
      AFD_THROW("unsupported JSON value in template input");
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

bool Value::Equals(const Value& o) const {
  const bool num_a = is_number() || is_bool(), num_b = o.is_number() || o.is_bool();
  if (num_a && num_b) {
    if (is_float() || o.is_float()) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return s_ == o.s_;
    case Kind::kList: {
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*o.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (dict_->items.size() != o.dict_->items.size()) return false;
      for (auto& [k, v] : dict_->items) {
        const Value* ov = o.dict_->Find(k);
        if (ov == nullptr || !v.Equals(*ov)) return false;
      }
      return true;
    }
    case Kind::kFunction:
      return fn_ == o.fn_;
    default:
      return false;
  }
}

std::vector<Value> Value::Iterate() const {
  switch (kind_) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return *list_;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : dict_->items) keys.emplace_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (size_t pos = 0, len; pos < s_.size(); pos += len) {
        DecodeUtf8(s_, pos, &len);
        chars.emplace_back(s_.substr(pos, len));
      }
      return chars;
    }
    default:
      AFD_THROW("'{}' object is not iterable", Repr());
  }
}

}  // namespace afd::text::chat_template

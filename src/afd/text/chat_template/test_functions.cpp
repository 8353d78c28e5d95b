#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "afd/common/error.h"
#include "afd/text/chat_template/builtins.h"
#include "afd/text/chat_template/string_methods.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text::chat_template {

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
  if (name == "escaped") return false;  // no Markup values: nothing is marked escaped
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
  if (name == "lt" || name == "lessthan" || name == "<") return SortLess(v, a0);
  if (name == "gt" || name == "greaterthan" || name == ">") return SortLess(a0, v);
  if (name == "le" || name == "<=") return !SortLess(a0, v);
  if (name == "ge" || name == ">=") return !SortLess(v, a0);
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
}  // namespace afd::text::chat_template

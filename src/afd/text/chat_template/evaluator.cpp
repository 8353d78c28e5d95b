// Expression evaluation of the interpreter (Interpreter::Eval and the operators' Python semantics).
#include <cmath>

#include "afd/common/error.h"
#include "afd/text/chat_template/builtins.h"
#include "afd/text/chat_template/interpreter.h"
#include "afd/text/chat_template/line_errors.h"
#include "afd/text/chat_template/string_methods.h"

namespace afd::text::chat_template {

namespace {

bool IsNum(const Value& v) { return v.is_number() || v.is_bool(); }

Value Arith(const std::string& op, const Value& a, const Value& b) {
  if (op == "%" && a.is_string()) {  // printf-style formatting, a tuple gives several values
    return Value(PercentFormat(a.as_string(), b.is_tuple() ? b.list() : std::vector<Value>{b}));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      std::vector<Value> items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items));
    }
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list()   ? &a
                       : b.is_string() || b.is_list() ? &b
                                                      : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq != nullptr && (count->is_int() || count->is_bool())) {
      const int64_t n = count->as_int();
      if (seq->is_string()) {
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->as_string();
        return Value(s);
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i)
        items.insert(items.end(), seq->list().begin(), seq->list().end());
      return Value::List(std::move(items));
    }
  }
  if (!IsNum(a) || !IsNum(b)) {
    if (a.is_undefined() || b.is_undefined()) AFD_THROW("an operand of '{}' is undefined", op);
    AFD_THROW("unsupported operand types for {}: {} and {}", op, a.Repr(), b.Repr());
  }
  const bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    AFD_CHECK(b.as_double() != 0, "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (ints) {
    const int64_t x = a.as_int(), y = b.as_int();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    AFD_CHECK(op == "**" || y != 0, "integer division or modulo by zero");
    if (op == "//") return Value(static_cast<int64_t>(std::floor(static_cast<double>(x) / y)));
    if (op == "%") return Value(((x % y) + y) % y);
    if (op == "**") {
      if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
      int64_t r = 1;
      for (int64_t i = 0; i < y; ++i) r *= x;
      return Value(r);
    }
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  AFD_CHECK(op == "**" || y != 0, "float division or modulo by zero");
  if (op == "//") return Value(std::floor(x / y));
  if (op == "%") return Value(x - y * std::floor(x / y));
  return Value(std::pow(x, y));
}

int Compare(const Value& a, const Value& b, const std::string& op) {
  if (IsNum(a) && IsNum(b)) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.as_string().compare(b.as_string());
  AFD_THROW("'{}' not supported between {} and {}", op, a.Repr(), b.Repr());
}

bool Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    AFD_CHECK(item.is_string(), "'in <string>' requires a string as left operand");
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.list()) {
      if (v.Equals(item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.dict().Find(item.as_string());
  if (container.is_undefined()) return false;  // Jinja2's Undefined iterates as empty
  AFD_THROW("argument of type {} is not iterable", container.Repr());
}

}  // namespace

Args Interpreter::EvalArgs(const Node& node, size_t first) {
  Args args;
  for (size_t i = first; i < node.args.size(); ++i) args.positional.push_back(Eval(*node.args[i]));
  for (const auto& [k, v] : node.kwargs) args.keyword.emplace_back(k, Eval(*v));
  return args;
}

Value Interpreter::EvalBinary(const Node& node) {
  const std::string& op = node.name;
  if (op == "and") {
    Value a = Eval(*node.args[0]);
    return a.Truthy() ? Eval(*node.args[1]) : a;
  }
  if (op == "or") {
    Value a = Eval(*node.args[0]);
    return a.Truthy() ? a : Eval(*node.args[1]);
  }
  const Value a = Eval(*node.args[0]);
  const Value b = Eval(*node.args[1]);
  return AtLine(node, [&]() -> Value {
    if (op == "~") return Value(a.Str() + b.Str());
    if (op == "==") return Value(a.Equals(b));
    if (op == "!=") return Value(!a.Equals(b));
    if (op == "in") return Value(Contains(b, a));
    if (op == "not in") return Value(!Contains(b, a));
    if (op == "<") return Value(Compare(a, b, op) < 0);
    if (op == ">") return Value(Compare(a, b, op) > 0);
    if (op == "<=") return Value(Compare(a, b, op) <= 0);
    if (op == ">=") return Value(Compare(a, b, op) >= 0);
    return Arith(op, a, b);
  });
}

Value Interpreter::Eval(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kLiteral:
      return node.literal;
    case Node::Kind::kName:
      return Lookup(node.name);
    case Node::Kind::kList: {
      std::vector<Value> items;
      for (const auto& a : node.args) items.push_back(Eval(*a));
      return Value::List(std::move(items), node.negated);
    }
    case Node::Kind::kDict: {
      Value d = Value::MakeDict();
      for (size_t i = 0; i + 1 < node.args.size(); i += 2) {
        const Value k = Eval(*node.args[i]);
        AFD_CHECK(k.is_string(), "{}{}: dict keys must be strings", kLinePrefix, node.line);
        d.dict().Set(k.as_string(), Eval(*node.args[i + 1]));
      }
      return d;
    }
    case Node::Kind::kGetAttr: {
      const Value obj = Eval(*node.args[0]);
      AFD_CHECK(!obj.is_undefined(), "{}{}: cannot read attribute '{}' of an undefined value",
                kLinePrefix, node.line, node.name);
      return AtLine(node, [&] { return GetAttr(obj, node.name); });
    }
    case Node::Kind::kGetItem: {
      const Value obj = Eval(*node.args[0]);
      const Value key = Eval(*node.args[1]);
      AFD_CHECK(!obj.is_undefined(), "{}{}: cannot index an undefined value with {}", kLinePrefix,
                node.line, key.Repr());
      return AtLine(node, [&] { return GetItem(obj, key); });
    }
    case Node::Kind::kSlice: {
      const Value obj = Eval(*node.args[0]);
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        parts[i] = node.args[i + 1] ? Eval(*node.args[i + 1]) : Value::None();
      return AtLine(node, [&] { return GetSlice(obj, parts[0], parts[1], parts[2]); });
    }
    case Node::Kind::kCall: {
      const Value callee = Eval(*node.args[0]);
      Args args = EvalArgs(node, 1);
      AFD_CHECK(callee.is_function(), "{}{}: {} is not callable", kLinePrefix, node.line,
                callee.is_undefined() ? "an undefined value" : callee.Repr());
      return AtLine(node, [&] { return callee.function()(args); });
    }
    case Node::Kind::kFilter: {
      const Value target = Eval(*node.args[0]);
      Args args = EvalArgs(node, 1);
      return AtLine(node, [&] { return ApplyFilter(node.name, target, args); });
    }
    case Node::Kind::kTest: {
      const Value target = Eval(*node.args[0]);
      Args args = EvalArgs(node, 1);
      const bool r = AtLine(node, [&] { return ApplyTest(node.name, target, args); });
      return Value(node.negated ? !r : r);
    }
    case Node::Kind::kUnary: {
      const Value v = Eval(*node.args[0]);
      if (node.name == "not") return Value(!v.Truthy());
      AFD_CHECK(IsNum(v), "{}{}: bad operand type for unary {}: {}", kLinePrefix, node.line,
                node.name, v.Repr());
      if (node.name == "+") return v.is_bool() ? Value(v.as_int()) : v;
      return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
    }
    case Node::Kind::kBinary:
      return EvalBinary(node);
    case Node::Kind::kCond: {
      if (Eval(*node.args[1]).Truthy()) return Eval(*node.args[0]);
      return node.args[2] ? Eval(*node.args[2]) : Value();
    }
    default:
      AFD_THROW("{}{}: not an expression", kLinePrefix, node.line);
  }
}

}  // namespace afd::text::chat_template

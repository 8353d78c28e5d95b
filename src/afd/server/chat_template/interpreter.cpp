#include "afd/server/chat_template/interpreter.h"

#include <cmath>

#include "afd/common/error.h"
#include "afd/server/chat_template/builtins.h"

namespace afd::server::jinja {

namespace {

constexpr const char* kLinePrefix = "chat template line ";

// Runs f; an afd::Error without a template line gets the line of `node`.
template <typename F>
auto AtLine(const Node& node, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind(kLinePrefix, 0) == 0 || msg.rfind("raise_exception", 0) == 0) throw;
    AFD_THROW("{}{}: {}", kLinePrefix, node.line, msg);
  }
}

bool IsNum(const Value& v) { return v.is_number() || v.is_bool(); }

Value Arith(const std::string& op, const Value& a, const Value& b) {
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

Interpreter::Interpreter(const Value& globals) {
  scopes_.emplace_back();
  for (const auto& [k, v] : globals.dict().items) scopes_[0][k] = v;
}

std::string Interpreter::Render(const Body& body) {
  std::string out;
  Exec(body, &out);
  return out;
}

Value Interpreter::Lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    const auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  return Value();
}

void Interpreter::Assign(const std::string& name, Value value) {
  scopes_.back()[name] = std::move(value);
}

Interpreter::Flow Interpreter::Exec(const Body& body, std::string* out) {
  for (const NodePtr& n : body) {
    const Flow f = ExecNode(*n, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecNode(const Node& node, std::string* out) {
  switch (node.kind) {
    case Node::Kind::kText:
      *out += node.name;
      return Flow::kNormal;
    case Node::Kind::kOutput:
      *out += Eval(*node.args[0]).Str();
      return Flow::kNormal;
    case Node::Kind::kIf:
      for (size_t i = 0; i < node.args.size(); ++i) {
        if (Eval(*node.args[i]).Truthy()) return Exec(node.bodies[i], out);
      }
      return Exec(node.else_body, out);
    case Node::Kind::kFor:
      ExecFor(node, out);
      return Flow::kNormal;
    case Node::Kind::kSet:
      ExecSet(node, out);
      return Flow::kNormal;
    case Node::Kind::kMacro:
      Assign(node.name, MakeMacro(node));
      return Flow::kNormal;
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
    case Node::Kind::kBlock:
      return Exec(node.body, out);
    default:
      AFD_THROW("{}{}: not a statement", kLinePrefix, node.line);
  }
}

void Interpreter::ExecFor(const Node& node, std::string* out) {
  const Value iterable = Eval(*node.args[0]);
  std::vector<Value> items = AtLine(node, [&] { return iterable.Iterate(); });
  auto bind = [&](const Value& item) {
    if (node.targets.size() == 1) {
      Assign(node.targets[0], item);
      return;
    }
    const std::vector<Value> parts = AtLine(node, [&] { return item.Iterate(); });
    AFD_CHECK(parts.size() == node.targets.size(), "{}{}: cannot unpack {} values into {}",
              kLinePrefix, node.line, parts.size(), node.targets.size());
    for (size_t i = 0; i < parts.size(); ++i) Assign(node.targets[i], parts[i]);
  };
  scopes_.emplace_back();
  if (node.args[1]) {  // `for x in xs if cond`: the loop sees only the items that pass
    std::vector<Value> kept;
    for (const Value& item : items) {
      bind(item);
      if (Eval(*node.args[1]).Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    Value loop = Value::MakeDict();
    Dict& d = loop.dict();
    d.Set("index0", Value(i));
    d.Set("index", Value(i + 1));
    d.Set("revindex0", Value(n - i - 1));
    d.Set("revindex", Value(n - i));
    d.Set("first", Value(i == 0));
    d.Set("last", Value(i == n - 1));
    d.Set("length", Value(n));
    d.Set("previtem", i > 0 ? items[i - 1] : Value());
    d.Set("nextitem", i + 1 < n ? items[i + 1] : Value());
    d.Set("cycle", Value::MakeFunction([i](Args& args) {
            AFD_CHECK(!args.positional.empty(), "loop.cycle needs at least one value");
            return args.positional[i % args.positional.size()];
          }));
    scopes_.emplace_back();  // each iteration starts fresh: a `set` does not reach the next
    Assign("loop", loop);
    bind(items[i]);
    const Flow flow = Exec(node.body, out);
    scopes_.pop_back();
    if (flow == Flow::kBreak) break;
  }
  scopes_.pop_back();
  if (n == 0) Exec(node.else_body, out);
}

void Interpreter::ExecSet(const Node& node, std::string* out) {
  (void)out;
  Value value;
  if (node.args.empty()) {  // block set
    std::string captured;
    Exec(node.body, &captured);
    value = Value(captured);
  } else {
    value = Eval(*node.args[0]);
  }
  if (!node.attr.empty()) {
    Value ns = Lookup(node.targets[0]);
    AFD_CHECK(ns.is_dict() && ns.dict().is_namespace,
              "{}{}: cannot assign attribute '{}' of '{}', which is not a namespace", kLinePrefix,
              node.line, node.attr, node.targets[0]);
    ns.dict().Set(node.attr, std::move(value));
    return;
  }
  if (node.targets.size() == 1) {
    Assign(node.targets[0], std::move(value));
    return;
  }
  const std::vector<Value> parts = AtLine(node, [&] { return value.Iterate(); });
  AFD_CHECK(parts.size() == node.targets.size(), "{}{}: cannot unpack {} values into {}",
            kLinePrefix, node.line, parts.size(), node.targets.size());
  for (size_t i = 0; i < parts.size(); ++i) Assign(node.targets[i], parts[i]);
}

Value Interpreter::MakeMacro(const Node& node) {
  const Node* macro = &node;
  return Value::MakeFunction([this, macro](Args& args) {
    const size_t num_params = macro->targets.size();
    const size_t first_default = num_params - macro->args.size();
    AFD_CHECK(args.positional.size() <= num_params, "macro '{}' takes {} arguments, {} given",
              macro->name, num_params, args.positional.size());
    Scope frame;
    for (size_t i = 0; i < num_params; ++i) {
      if (i < args.positional.size()) {
        frame[macro->targets[i]] = args.positional[i];
      } else if (i >= first_default) {
        frame[macro->targets[i]] = Eval(*macro->args[i - first_default]);
      } else {
        frame[macro->targets[i]] = Value();
      }
    }
    for (auto& [k, v] : args.keyword) {
      bool known = false;
      for (const auto& p : macro->targets) known = known || p == k;
      AFD_CHECK(known, "macro '{}' has no parameter '{}'", macro->name, k);
      frame[k] = v;
    }
    std::vector<Scope> saved = std::move(scopes_);
    scopes_ = {saved[0], std::move(frame)};
    std::string out;
    try {
      Exec(macro->body, &out);
    } catch (...) {
      scopes_ = std::move(saved);
      throw;
    }
    scopes_ = std::move(saved);
    return Value(out);
  });
}

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

}  // namespace afd::server::jinja

#include "afd/text/chat_template/interpreter.h"

#include <cmath>

#include "afd/common/error.h"
#include "afd/text/chat_template/builtins.h"
#include "afd/text/chat_template/line_errors.h"

namespace afd::text::chat_template {

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

}  // namespace afd::text::chat_template

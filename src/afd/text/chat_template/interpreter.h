// Renders a parsed chat template (ast.h) with Jinja2 semantics: scopes (a `for` body and a macro
// call get their own; `if` does not), loop variables, macros, namespaces and break/continue.
//
// Thread safety: one Interpreter per render.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "afd/text/chat_template/ast.h"
#include "afd/text/chat_template/value.h"

namespace afd::text::chat_template {

class Interpreter {
 public:
  // `globals` is a dict of the variables the template sees (messages, tools, ...).
  explicit Interpreter(const Value& globals);

  // Throws afd::Error naming the template line of a runtime error, or carrying the message of
  // raise_exception().
  std::string Render(const Body& body);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  Flow Exec(const Body& body, std::string* out);
  Flow ExecNode(const Node& node, std::string* out);
  void ExecFor(const Node& node, std::string* out);
  void ExecSet(const Node& node, std::string* out);
  Value Eval(const Node& node);
  Value EvalBinary(const Node& node);
  Value Lookup(const std::string& name) const;
  void Assign(const std::string& name, Value value);
  Args EvalArgs(const Node& node, size_t first);
  Value MakeMacro(const Node& node);

  std::vector<Scope> scopes_;
};

}  // namespace afd::text::chat_template

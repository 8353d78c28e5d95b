// Syntax tree of a parsed chat template. One node type for expressions and statements; which
// fields are used depends on `kind` (noted per kind below).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "afd/text/chat_template/value.h"

namespace afd::text::chat_template {

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    // Expressions.
    kLiteral,  // literal
    kName,     // name
    kList,     // args = items (also tuples)
    kDict,     // args = key, value, key, value, ...
    kGetAttr,  // args[0] . name
    kGetItem,  // args[0] [ args[1] ]
    kSlice,    // args[0] [ args[1] : args[2] : args[3] ] (null = omitted)
    kCall,     // args[0] ( args[1..] , kwargs )
    kFilter,   // args[0] | name ( args[1..] , kwargs )
    kTest,     // args[0] is [not: negated] name ( args[1..] )
    kUnary,    // name in {not, -, +}, args[0]
    kBinary,   // name = operator (and, or, in, not in, ==, +, ~, ...), args[0], args[1]
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
    // Statements.
    kText,    // name = the text
    kOutput,  // {{ args[0] }}
    kIf,      // args = conditions; bodies[i] runs for args[i]; else_body otherwise
    kFor,     // targets in args[0] [if args[1]]: body, else_body
    kSet,     // targets (or name.attr: targets = {name}, attr) = args[0], or a block: body
    kMacro,   // name(targets = params, args = defaults aligned right): body
    kBreak,
    kContinue,
    kBlock,  // body (e.g. {% generation %}): rendered in place
  };

  Kind kind;
  int line = 0;
  std::string name;
  std::string attr;
  Value literal;
  bool negated = false;
  std::vector<NodePtr> args;
  std::vector<std::pair<std::string, NodePtr>> kwargs;
  std::vector<std::string> targets;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
};

}  // namespace afd::text::chat_template

// The chat-template parser's class, shared by parser.cpp (statements, tags) and
// expression_parser.cpp (expressions, by Jinja2's precedence). Internal to chat_template/.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "afd/text/chat_template/ast.h"
#include "afd/text/chat_template/lexer.h"

namespace afd::text::chat_template {

// Recursive-descent parser over the lexer's tokens; throws afd::Error naming the template line.
class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}
  Body ParseTemplate();

 private:
  using T = Token::Type;

  const Token& Cur() const { return t_[pos_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return Cur().type == T::kOperator && Cur().value == op; }
  bool IsName(const char* name) const { return Cur().type == T::kName && Cur().value == name; }
  [[noreturn]] void Fail(const std::string& what) const;
  void ExpectOp(const char* op);
  std::string ExpectName();
  void ExpectBlockEnd();
  NodePtr Make(Node::Kind kind, int line);
  // Parses statements until a block tag whose name is in `ends`; stores that name in *end and
  // leaves the position after the name. At top level `ends` is empty and the input must end.
  Body ParseBody(const std::vector<std::string>& ends, std::string* end);
  NodePtr ParseStatement();
  NodePtr ParseIf(int line);
  NodePtr ParseFor(int line);
  NodePtr ParseSet(int line);
  NodePtr ParseMacro(int line);
  // expression [, expression ...] -> a list node when there is a comma (Python tuple).
  NodePtr ParseTuple();
  NodePtr ParseExpression() { return ParseCondExpr(true); }
  NodePtr ParseCondExpr(bool allow_cond);
  NodePtr Binary(const std::string& op, NodePtr a, NodePtr b, int line);
  NodePtr ParseOr();
  NodePtr ParseAnd();
  NodePtr ParseNot();
  NodePtr ParseCompare();
  NodePtr ParseMath1();
  NodePtr ParseConcat();
  NodePtr ParseMath2();
  NodePtr ParsePow();
  NodePtr ParseUnary(bool with_filter);
  NodePtr ParsePrimary();
  void ParseCallArgs(Node* n);
  NodePtr ParsePostfix(NodePtr node);
  NodePtr ParseSubscript(NodePtr target, int line);
  NodePtr ParseFilterExpr(NodePtr node);

  const std::vector<Token>& t_;
  size_t pos_ = 0;
};

}  // namespace afd::text::chat_template

#include "afd/common/error.h"
#include "afd/text/chat_template/parser_impl.h"

namespace afd::text::chat_template {

// expression [, expression ...] -> a list node when there is a comma (Python tuple).
NodePtr Parser::ParseTuple() {
  const int line = Cur().line;
  NodePtr first = ParseExpression();
  if (!IsOp(",")) return first;
  auto n = Make(Node::Kind::kList, line);
  n->negated = true;  // a tuple
  n->args.push_back(std::move(first));
  while (IsOp(",")) {
    ++pos_;
    if (Cur().type == T::kBlockEnd || IsOp(")")) break;
    n->args.push_back(ParseExpression());
  }
  return n;
}

NodePtr Parser::ParseCondExpr(bool allow_cond) {
  NodePtr expr = ParseOr();
  while (allow_cond && IsName("if")) {
    const int line = Cur().line;
    ++pos_;
    auto n = Make(Node::Kind::kCond, line);
    n->args.push_back(std::move(expr));
    n->args.push_back(ParseOr());
    if (IsName("else")) {
      ++pos_;
      n->args.push_back(ParseCondExpr(true));
    } else {
      n->args.push_back(nullptr);
    }
    expr = std::move(n);
  }
  return expr;
}

NodePtr Parser::Binary(const std::string& op, NodePtr a, NodePtr b, int line) {
  auto n = Make(Node::Kind::kBinary, line);
  n->name = op;
  n->args.push_back(std::move(a));
  n->args.push_back(std::move(b));
  return n;
}

NodePtr Parser::ParseOr() {
  NodePtr left = ParseAnd();
  while (IsName("or")) {
    const int line = Cur().line;
    ++pos_;
    left = Binary("or", std::move(left), ParseAnd(), line);
  }
  return left;
}

NodePtr Parser::ParseAnd() {
  NodePtr left = ParseNot();
  while (IsName("and")) {
    const int line = Cur().line;
    ++pos_;
    left = Binary("and", std::move(left), ParseNot(), line);
  }
  return left;
}

NodePtr Parser::ParseNot() {
  if (IsName("not")) {
    auto n = Make(Node::Kind::kUnary, Cur().line);
    ++pos_;
    n->name = "not";
    n->args.push_back(ParseNot());
    return n;
  }
  return ParseCompare();
}

NodePtr Parser::ParseCompare() {
  NodePtr left = ParseMath1();
  while (true) {
    const int line = Cur().line;
    std::string op;
    if (Cur().type == T::kOperator &&
        (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" || Cur().value == ">" ||
         Cur().value == "<=" || Cur().value == ">=")) {
      op = Cur().value;
      ++pos_;
    } else if (IsName("in")) {
      op = "in";
      ++pos_;
    } else if (IsName("not") && Peek().type == T::kName && Peek().value == "in") {
      op = "not in";
      pos_ += 2;
    } else {
      return left;
    }
    left = Binary(op, std::move(left), ParseMath1(), line);
  }
}

NodePtr Parser::ParseMath1() {
  NodePtr left = ParseConcat();
  while (IsOp("+") || IsOp("-")) {
    const std::string op = Cur().value;
    const int line = Cur().line;
    ++pos_;
    left = Binary(op, std::move(left), ParseConcat(), line);
  }
  return left;
}

NodePtr Parser::ParseConcat() {
  NodePtr left = ParseMath2();
  while (IsOp("~")) {
    const int line = Cur().line;
    ++pos_;
    left = Binary("~", std::move(left), ParseMath2(), line);
  }
  return left;
}

NodePtr Parser::ParseMath2() {
  NodePtr left = ParsePow();
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    const std::string op = Cur().value;
    const int line = Cur().line;
    ++pos_;
    left = Binary(op, std::move(left), ParsePow(), line);
  }
  return left;
}

NodePtr Parser::ParsePow() {
  NodePtr left = ParseUnary(true);
  while (IsOp("**")) {
    const int line = Cur().line;
    ++pos_;
    left = Binary("**", std::move(left), ParseUnary(true), line);
  }
  return left;
}

NodePtr Parser::ParseUnary(bool with_filter) {
  NodePtr node;
  if (IsOp("-") || IsOp("+")) {
    auto n = Make(Node::Kind::kUnary, Cur().line);
    n->name = Cur().value;
    ++pos_;
    n->args.push_back(ParseUnary(false));
    node = std::move(n);
  } else {
    node = ParsePrimary();
  }
  node = ParsePostfix(std::move(node));
  if (with_filter) node = ParseFilterExpr(std::move(node));
  return node;
}

NodePtr Parser::ParsePrimary() {
  const Token& tok = Cur();
  const int line = tok.line;
  if (tok.type == T::kName) {
    ++pos_;
    const std::string& v = tok.value;
    auto lit = [&](Value value) {
      auto n = Make(Node::Kind::kLiteral, line);
      n->literal = std::move(value);
      return n;
    };
    if (v == "true" || v == "True") return lit(Value(true));
    if (v == "false" || v == "False") return lit(Value(false));
    if (v == "none" || v == "None") return lit(Value::None());
    auto n = Make(Node::Kind::kName, line);
    n->name = v;
    return n;
  }
  if (tok.type == T::kString) {
    std::string s;
    while (Cur().type == T::kString) s += t_[pos_++].value;  // adjacent literals concatenate
    auto n = Make(Node::Kind::kLiteral, line);
    n->literal = Value(s);
    return n;
  }
  if (tok.type == T::kInt || tok.type == T::kFloat) {
    ++pos_;
    auto n = Make(Node::Kind::kLiteral, line);
    n->literal = tok.type == T::kInt ? Value(static_cast<int64_t>(std::stoll(tok.value)))
                                     : Value(std::stod(tok.value));
    return n;
  }
  if (IsOp("(")) {
    ++pos_;
    if (IsOp(")")) {
      ++pos_;
      auto empty = Make(Node::Kind::kList, line);
      empty->negated = true;  // ()
      return empty;
    }
    NodePtr inner = ParseTuple();
    ExpectOp(")");
    return inner;
  }
  if (IsOp("[")) {
    ++pos_;
    auto n = Make(Node::Kind::kList, line);
    while (!IsOp("]")) {
      n->args.push_back(ParseExpression());
      if (!IsOp(",")) break;
      ++pos_;
    }
    ExpectOp("]");
    return n;
  }
  if (IsOp("{")) {
    ++pos_;
    auto n = Make(Node::Kind::kDict, line);
    while (!IsOp("}")) {
      n->args.push_back(ParseExpression());
      ExpectOp(":");
      n->args.push_back(ParseExpression());
      if (!IsOp(",")) break;
      ++pos_;
    }
    ExpectOp("}");
    return n;
  }
  Fail(tok.type == T::kEnd || tok.type == T::kBlockEnd || tok.type == T::kVarEnd
           ? "unexpected end of expression"
           : fmt::format("unexpected '{}'", tok.value));
}

void Parser::ParseCallArgs(Node* n) {
  ExpectOp("(");
  while (!IsOp(")")) {
    if (Cur().type == T::kName && Peek().type == T::kOperator && Peek().value == "=") {
      std::string key = t_[pos_].value;
      pos_ += 2;
      n->kwargs.emplace_back(std::move(key), ParseExpression());
    } else {
      if (!n->kwargs.empty()) Fail("a positional argument follows a keyword argument");
      n->args.push_back(ParseExpression());
    }
    if (!IsOp(",")) break;
    ++pos_;
  }
  ExpectOp(")");
}

NodePtr Parser::ParsePostfix(NodePtr node) {
  while (true) {
    const int line = Cur().line;
    if (IsOp(".")) {
      ++pos_;
      auto n = Make(Node::Kind::kGetAttr, line);
      if (Cur().type == T::kInt) {  // foo.0 is foo[0]
        n->kind = Node::Kind::kGetItem;
        n->args.push_back(std::move(node));
        auto idx = Make(Node::Kind::kLiteral, line);
        idx->literal = Value(static_cast<int64_t>(std::stoll(t_[pos_++].value)));
        n->args.push_back(std::move(idx));
      } else {
        n->name = ExpectName();
        n->args.push_back(std::move(node));
      }
      node = std::move(n);
    } else if (IsOp("[")) {
      ++pos_;
      node = ParseSubscript(std::move(node), line);
    } else if (IsOp("(")) {
      auto n = Make(Node::Kind::kCall, line);
      n->args.push_back(std::move(node));
      ParseCallArgs(n.get());
      node = std::move(n);
    } else {
      return node;
    }
  }
}

NodePtr Parser::ParseSubscript(NodePtr target, int line) {
  NodePtr parts[3];
  int colons = 0;
  while (!IsOp("]")) {
    if (IsOp(":")) {
      ++pos_;
      if (++colons > 2) Fail("too many ':' in a slice");
      continue;
    }
    if (parts[colons]) Fail("expected ':' or ']'");
    parts[colons] = ParseExpression();
  }
  ExpectOp("]");
  if (colons == 0) {
    if (!parts[0]) Fail("empty subscript");
    auto n = Make(Node::Kind::kGetItem, line);
    n->args.push_back(std::move(target));
    n->args.push_back(std::move(parts[0]));
    return n;
  }
  auto n = Make(Node::Kind::kSlice, line);
  n->args.push_back(std::move(target));
  for (auto& p : parts) n->args.push_back(std::move(p));
  return n;
}

NodePtr Parser::ParseFilterExpr(NodePtr node) {
  while (true) {
    const int line = Cur().line;
    if (IsOp("|")) {
      ++pos_;
      auto n = Make(Node::Kind::kFilter, line);
      n->name = ExpectName();
      n->args.push_back(std::move(node));
      if (IsOp("(")) ParseCallArgs(n.get());
      node = std::move(n);
    } else if (IsName("is")) {
      ++pos_;
      auto n = Make(Node::Kind::kTest, line);
      if (IsName("not")) {
        ++pos_;
        n->negated = true;
      }
      n->name = ExpectName();
      n->args.push_back(std::move(node));
      if (IsOp("(")) {
        ParseCallArgs(n.get());
      } else if ((Cur().type == T::kName || Cur().type == T::kString || Cur().type == T::kInt ||
                  Cur().type == T::kFloat || IsOp("[") || IsOp("{")) &&
                 !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if") &&
                 !IsName("in") && !IsName("not")) {
        n->args.push_back(ParsePostfix(ParsePrimary()));
      }
      node = std::move(n);
    } else if (IsOp("(")) {
      auto n = Make(Node::Kind::kCall, line);
      n->args.push_back(std::move(node));
      ParseCallArgs(n.get());
      node = std::move(n);
    } else {
      return node;
    }
  }
}

}  // namespace afd::text::chat_template

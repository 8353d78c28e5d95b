#include "afd/text/chat_template/parser.h"

#include "afd/common/error.h"
#include "afd/text/chat_template/parser_impl.h"

namespace afd::text::chat_template {

Body Parser::ParseTemplate() {
  std::string end;
  Body body = ParseBody({}, &end);
  return body;
}

void Parser::Fail(const std::string& what) const {
  AFD_THROW("chat template line {}: {}", Cur().line, what);
}

void Parser::ExpectOp(const char* op) {
  if (!IsOp(op)) Fail(fmt::format("expected '{}'", op));
  ++pos_;
}

std::string Parser::ExpectName() {
  if (Cur().type != T::kName) Fail("expected a name");
  return t_[pos_++].value;
}

void Parser::ExpectBlockEnd() {
  if (Cur().type != T::kBlockEnd) Fail("expected '%}'");
  ++pos_;
}

NodePtr Parser::Make(Node::Kind kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

// Parses statements until a block tag whose name is in `ends`; stores that name in *end and
// leaves the position after the name. At top level `ends` is empty and the input must end.
Body Parser::ParseBody(const std::vector<std::string>& ends, std::string* end) {
  Body body;
  while (true) {
    const Token& tok = Cur();
    if (tok.type == T::kEnd) {
      if (!ends.empty()) Fail(fmt::format("missing {{% {} %}}", ends.back()));
      return body;
    }
    if (tok.type == T::kText) {
      auto n = Make(Node::Kind::kText, tok.line);
      n->name = tok.value;
      body.push_back(std::move(n));
      ++pos_;
    } else if (tok.type == T::kVarBegin) {
      ++pos_;
      auto n = Make(Node::Kind::kOutput, tok.line);
      n->args.push_back(ParseExpression());
      if (Cur().type != T::kVarEnd) Fail("expected '}}'");
      ++pos_;
      body.push_back(std::move(n));
    } else if (tok.type == T::kBlockBegin) {
      ++pos_;
      const std::string name = Cur().type == T::kName ? Cur().value : "";
      for (const auto& e : ends) {
        if (name == e) {
          ++pos_;
          *end = name;
          return body;
        }
      }
      body.push_back(ParseStatement());
    } else {
      Fail("unexpected token");
    }
  }
}

NodePtr Parser::ParseStatement() {
  const int line = Cur().line;
  const std::string name = ExpectName();
  if (name == "if") return ParseIf(line);
  if (name == "for") return ParseFor(line);
  if (name == "set") return ParseSet(line);
  if (name == "macro") return ParseMacro(line);
  if (name == "break" || name == "continue") {
    ExpectBlockEnd();
    return Make(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line);
  }
  if (name == "generation") {
    ExpectBlockEnd();
    auto n = Make(Node::Kind::kBlock, line);
    std::string end;
    n->body = ParseBody({"endgeneration"}, &end);
    ExpectBlockEnd();
    return n;
  }
  AFD_THROW("chat template line {}: unsupported tag '{}'", line, name);
}

NodePtr Parser::ParseIf(int line) {
  auto n = Make(Node::Kind::kIf, line);
  while (true) {
    n->args.push_back(ParseExpression());
    ExpectBlockEnd();
    std::string end;
    n->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
    if (end == "elif") continue;
    if (end == "else") {
      ExpectBlockEnd();
      n->else_body = ParseBody({"endif"}, &end);
    }
    ExpectBlockEnd();
    return n;
  }
}

NodePtr Parser::ParseFor(int line) {
  auto n = Make(Node::Kind::kFor, line);
  n->targets.push_back(ExpectName());
  while (IsOp(",")) {
    ++pos_;
    n->targets.push_back(ExpectName());
  }
  if (!IsName("in")) Fail("expected 'in'");
  ++pos_;
  n->args.push_back(ParseCondExpr(/*allow_cond=*/false));
  if (IsName("if")) {
    ++pos_;
    n->args.push_back(ParseCondExpr(false));
  } else {
    n->args.push_back(nullptr);
  }
  if (IsName("recursive")) Fail("recursive loops are not supported");
  ExpectBlockEnd();
  std::string end;
  n->body = ParseBody({"else", "endfor"}, &end);
  if (end == "else") {
    ExpectBlockEnd();
    n->else_body = ParseBody({"endfor"}, &end);
  }
  ExpectBlockEnd();
  return n;
}

NodePtr Parser::ParseSet(int line) {
  auto n = Make(Node::Kind::kSet, line);
  n->targets.push_back(ExpectName());
  if (IsOp(".")) {
    ++pos_;
    n->attr = ExpectName();
  } else {
    while (IsOp(",")) {
      ++pos_;
      n->targets.push_back(ExpectName());
    }
  }
  if (Cur().type == T::kBlockEnd) {  // {% set x %}...{% endset %}
    ++pos_;
    std::string end;
    n->body = ParseBody({"endset"}, &end);
    ExpectBlockEnd();
    return n;
  }
  ExpectOp("=");
  n->args.push_back(ParseTuple());
  ExpectBlockEnd();
  return n;
}

NodePtr Parser::ParseMacro(int line) {
  auto n = Make(Node::Kind::kMacro, line);
  n->name = ExpectName();
  ExpectOp("(");
  while (!IsOp(")")) {
    n->targets.push_back(ExpectName());
    if (IsOp("=")) {
      ++pos_;
      n->args.push_back(ParseExpression());
    } else {
      if (!n->args.empty()) Fail("a parameter without default follows one with a default");
    }
    if (!IsOp(",")) break;
    ++pos_;
  }
  ExpectOp(")");
  ExpectBlockEnd();
  std::string end;
  n->body = ParseBody({"endmacro"}, &end);
  ExpectBlockEnd();
  return n;
}

Body Parse(const std::vector<Token>& tokens) { return Parser(tokens).ParseTemplate(); }

}  // namespace afd::text::chat_template

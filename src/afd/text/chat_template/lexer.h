// Tokenizes a Jinja2 template with the environment transformers uses for chat templates:
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False; whitespace control with
// `-` (strip) and `+` (keep) at tag edges; comments dropped; {% raw %} kept verbatim. Newlines
// \r\n and \r become \n as in Jinja2.
#pragma once

#include <string>
#include <vector>

namespace afd::text::chat_template {

struct Token {
  enum class Type {
    kText,        // template data (value = the text)
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // value = the unescaped string
    kInt,
    kFloat,
    kOperator,  // value = the operator: + - * / // % ** ~ == != < > <= >= = . , : | ( ) [ ] { }
    kEnd,
  };
  Type type;
  std::string value;
  int line;
};

// Throws afd::Error naming the template line for an unterminated tag or string, or a character
// that is not part of the expression syntax.
std::vector<Token> Lex(const std::string& source);

}  // namespace afd::text::chat_template

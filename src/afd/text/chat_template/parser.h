// Parses chat-template tokens (lexer.h) into a tree (ast.h): the Jinja2 subset real chat
// templates use (for/if/set/macro/raw/break/continue/generation, full expression syntax with
// filters and tests). Operator precedence follows Jinja2's parser.
#pragma once

#include <vector>

#include "afd/text/chat_template/ast.h"
#include "afd/text/chat_template/lexer.h"

namespace afd::text::chat_template {

// Throws afd::Error naming the template line of the first syntax error, or an unsupported tag.
Body Parse(const std::vector<Token>& tokens);

}  // namespace afd::text::chat_template

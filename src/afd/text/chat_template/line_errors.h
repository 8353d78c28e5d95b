// Adds the template line to errors raised while evaluating a node (interpreter internals).
#pragma once

#include <string>

#include "afd/common/error.h"
#include "afd/text/chat_template/ast.h"

namespace afd::text::chat_template {

inline constexpr const char* kLinePrefix = "chat template line ";

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

}  // namespace afd::text::chat_template

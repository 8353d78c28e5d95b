// A chat template (tokenizer_config.json's "chat_template"), parsed once and rendered per request
// as transformers' apply_chat_template does: Jinja2 with trim_blocks, lstrip_blocks, the
// loopcontrols extension, and the globals raise_exception, strftime_now and the tojson filter.
//
// Thread safety: Render may be called from several threads.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace afd::text {

namespace chat_template {
struct Node;
}

class ChatTemplate {
 public:
  // Throws afd::Error naming the template line of a syntax error.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();

  // Renders with `context`'s keys as variables (messages, tools, add_generation_prompt,
  // bos_token, eos_token, ...). Throws afd::Error naming the template line of a runtime error,
  // or with raise_exception's message.
  std::string Render(const nlohmann::ordered_json& context) const;

 private:
  std::unique_ptr<std::vector<std::unique_ptr<chat_template::Node>>> body_;
};

}  // namespace afd::text

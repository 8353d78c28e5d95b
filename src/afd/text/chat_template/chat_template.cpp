#include "afd/text/chat_template/chat_template.h"

#include "afd/common/error.h"
#include "afd/text/chat_template/builtins.h"
#include "afd/text/chat_template/interpreter.h"
#include "afd/text/chat_template/parser.h"

namespace afd::text {

ChatTemplate::ChatTemplate(const std::string& source)
    : body_(
          std::make_unique<chat_template::Body>(chat_template::Parse(chat_template::Lex(source)))) {
}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  AFD_CHECK(context.is_object(), "chat template context must be a JSON object");
  chat_template::Value globals = chat_template::Value::MakeDict();
  chat_template::AddGlobalFunctions(&globals);
  for (const auto& [k, v] : context.items())
    globals.dict().Set(k, chat_template::Value::FromJson(v));
  chat_template::Interpreter interpreter(globals);
  return interpreter.Render(*body_);
}

}  // namespace afd::text

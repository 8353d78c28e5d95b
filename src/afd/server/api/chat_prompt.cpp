#include "afd/server/api/chat_prompt.h"

#include "afd/common/error.h"
#include "afd/server/api/api_error.h"

namespace afd::server::api {

namespace {

// A message's content: a string, null, or a list of {"type": "text", "text"} parts (joined
// with "\n", as vLLM does).
json MessageContent(const json& content) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) {
    ThrowBadRequest("messages", "a message's content must be a string or a list of parts");
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      ThrowBadRequest("messages",
                      "only text content parts ({{\"type\": \"text\", \"text\": ...}}) "
                      "are supported");
    }
    if (i > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

PromptInput ChatPrompt(const ServerContext& ctx, const json& body,
                       bool default_add_special_tokens) {
  if (ctx.tokenizer() == nullptr) {
    ThrowBadRequest("messages", "chat needs a tokenizer; this server has none");
  }
  if (ctx.chat_template() == nullptr) {
    ThrowBadRequest("messages",
                    "the tokenizer has no chat template, so chat is not available: "
                    "use /v1/completions");
  }
  const json* messages = FindField(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    ThrowBadRequest("messages", "'messages' must be a non-empty list of messages");
  }
  json normalized = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      ThrowBadRequest("messages", "each message must be an object with a string 'role'");
    }
    // OpenAI's roles only: a template drops a role it does not know without a word, and the
    // message would vanish from the prompt.
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
        role != "tool" && role != "function") {
      ThrowBadRequest("messages",
                      "messages[{}].role '{}' is not one of 'system', 'developer', 'user', "
                      "'assistant', 'tool', 'function'",
                      i, role);
    }
    json copy = m;
    copy["content"] = MessageContent(m.contains("content") ? m["content"] : json(nullptr));
    normalized.push_back(std::move(copy));
  }
  json context = json::object();
  if (const json* kwargs = FindField(body, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) {
      ThrowBadRequest("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    context = *kwargs;
  }
  context["messages"] = std::move(normalized);
  const bool add_generation_prompt = BoolField(body, "add_generation_prompt", true);
  const bool continue_final = BoolField(body, "continue_final_message", false);
  if (continue_final && add_generation_prompt) {
    ThrowBadRequest(
        "continue_final_message",
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  }
  std::string final_message;  // continue_final_message: the prompt ends with it
  if (continue_final) {
    const json& last = context["messages"].back();
    if (last["content"].is_string()) final_message = last["content"].get<std::string>();
    const size_t b = final_message.find_first_not_of(" \t\n\r");
    const size_t e = final_message.find_last_not_of(" \t\n\r");
    final_message = b == std::string::npos ? "" : final_message.substr(b, e - b + 1);
    if (final_message.empty()) {
      ThrowBadRequest("continue_final_message",
                      "continue_final_message needs a final message with text content");
    }
  }
  context["add_generation_prompt"] = add_generation_prompt;
  const json* tools = FindField(body, "tools");
  context["tools"] = tools != nullptr ? *tools : json(nullptr);
  // vLLM's `documents` (RAG templates): given to the template as `documents`.
  if (const json* docs = FindField(body, "documents"); docs != nullptr && !docs->is_null()) {
    if (!docs->is_array()) ThrowBadRequest("documents", "'documents' must be a list of objects");
    context["documents"] = *docs;
  } else if (!context.contains("documents")) {
    context["documents"] = nullptr;
  }
  for (const auto& [key, value] : ctx.tokenizer()->special_tokens_map()) {
    if (!context.contains(key)) context[key] = value;
  }
  PromptInput p;
  try {
    p.text = ctx.chat_template()->Render(context);
  } catch (const Error& e) {
    ThrowBadRequest("messages", "the chat template failed: {}", e.what());
  }
  if (continue_final) {
    // The rendered chat up to the end of the final message: the model continues it (what
    // transformers' apply_chat_template does).
    const size_t at = p.text.rfind(final_message);
    if (at == std::string::npos) {
      ThrowBadRequest("continue_final_message",
                      "continue_final_message is set but the final message does not appear in "
                      "the chat after applying the chat template");
    }
    p.text.resize(at + final_message.size());
  }
  const bool add_special = BoolField(body, "add_special_tokens", default_add_special_tokens);
  for (uint32_t id : ctx.tokenizer()->Encode(p.text, add_special)) {
    p.ids.push_back(static_cast<int32_t>(id));
  }
  return p;
}

}  // namespace afd::server::api

// A chat request's prompt: its "messages" rendered through the chat template (as
// transformers' apply_chat_template: add_generation_prompt, tools, documents, the special tokens,
// and the request's chat_template_kwargs), then tokenized. 400 without a tokenizer or template,
// for malformed messages, or when the template raises.
//
// Thread safety: pure function.
#pragma once

#include "afd/server/api/sampling_request.h"

namespace afd::server::api {

// `body`: a chat request or a /tokenize request with "messages". The add_special_tokens field
// (vLLM's extension) defaults to `default_add_special_tokens`.
PromptInput ChatPrompt(const ServerContext& ctx, const json& body, bool default_add_special_tokens);

}  // namespace afd::server::api

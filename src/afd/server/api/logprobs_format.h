// The two OpenAI logprobs shapes. Token strings are each token decoded alone (special tokens
// kept), or "token_id:<id>" without a tokenizer (vLLM's --return-tokens-as-token-ids form).
// Log-probabilities of -inf are written as -9999.0 (JSON has no infinity), as vLLM does.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "afd/runtime/request.h"
#include "afd/server/api/json_fields.h"
#include "afd/text/tokenizer/tokenizer.h"

namespace afd::server::api {

std::string TokenString(const text::Tokenizer* tokenizer, int32_t id);

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} for `ids`.
// `logprobs[i]` == nullptr gives null entries (the first prompt token of an echo).
// `text_offset` is the offset of the first token; it advances past the last.
json CompletionLogprobs(const text::Tokenizer* tokenizer, const std::vector<int32_t>& ids,
                        const std::vector<const runtime::TokenLogprobs*>& logprobs,
                        int64_t* text_offset);

// Appends the entries of `ids` to a completions logprobs object made by CompletionLogprobs.
void AppendCompletionLogprobs(json& into, const json& more);

// Chat: the "content" array [{"token", "logprob", "bytes", "top_logprobs": [...]}], with
// `num_top` entries of top_logprobs per token.
json ChatLogprobsContent(const text::Tokenizer* tokenizer, const std::vector<int32_t>& ids,
                         const std::vector<runtime::TokenLogprobs>& logprobs, int32_t num_top);

}  // namespace afd::server::api

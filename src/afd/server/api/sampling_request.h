// The generation fields shared by /v1/completions and /v1/chat/completions, parsed and checked
// once (400 for a wrong type or an out-of-range value, naming the field), and their mapping to
// the engine's runtime::RequestParams, one per choice.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "afd/runtime/request.h"
#include "afd/server/api/http_types.h"
#include "afd/server/api/json_fields.h"
#include "afd/server/api/server_context.h"

namespace afd::server::api {

enum class Endpoint { kCompletions, kChat };

// max_tokens of a /v1/completions request that names none (OpenAI's and vLLM's default) when the
// server has no --max-tokens; chat requests get the rest of the context.
inline constexpr int64_t kCompletionsDefaultMaxTokens = 16;

// A request's kv_transfer_params (vLLM's fields; docs/pd.md): the prefill leg asks the rows held
// (do_remote_decode), the decode leg names where to pull them from (do_remote_prefill).
struct KvTransferParams {
  bool remote_decode = false;
  bool remote_prefill = false;
  std::string remote_engine_id, remote_host;
  int remote_port = 0;
  uint64_t remote_request_id = 0;
};

struct SamplingRequest {
  std::string model;  // as named by the request ("" when absent)
  // The response id's base: the X-Request-Id header, else the body's request_id, else "" (a
  // random one), as vLLM names its responses.
  std::string request_id;
  int64_t n = 1;
  std::optional<int64_t> max_tokens;  // absent (chat only): up to the model length
  runtime::SamplingParams sampling;
  bool has_seed = false;
  std::vector<std::string> stop;  // stop strings, none empty
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;  // the matched stop string ends the text
  bool return_tokens_as_token_ids = false;  // logprobs' token strings as "token_id:<id>"
  bool add_special_tokens = true;           // completions' text prompts: BOS and the like
  // Keep only the prompt's last k tokens (-1: the model length); nullopt: no truncation.
  std::optional<int64_t> truncate_prompt_tokens;
  int32_t logprobs = -1;  // -1: none; else the number of top tokens per position
  bool echo = false;      // completions only
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;  // usage on every chunk (with include_usage)
  bool return_token_ids = false;
  KvTransferParams kv;
};

// One prompt: its ids, and its text as echoed (the request's string, or the ids' decoding;
// empty without a tokenizer).
struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;
};

SamplingRequest ParseSamplingRequest(const json& body, Endpoint endpoint, const ServerContext& ctx,
                                     const HttpRequest& http);

// The response id: prefix + the request's id, or a random one.
std::string ResponseId(ServerContext& ctx, const SamplingRequest& request,
                       const std::string& prefix);

// The prompt's last request.truncate_prompt_tokens ids when it is longer (vLLM's
// truncate_prompt_tokens; its text, echoed, stays the request's).
PromptInput TruncatePrompt(PromptInput prompt, const SamplingRequest& request);

// The tokenizer that names tokens in logprobs: none (so "token_id:<id>") with
// return_tokens_as_token_ids.
inline const text::Tokenizer* LogprobsTokenizer(const ServerContext& ctx,
                                                const SamplingRequest& request) {
  return request.return_tokens_as_token_ids ? nullptr : ctx.tokenizer();
}

// A JSON array of token ids, each in [0, vocab_size); 400 naming `param` otherwise.
std::vector<int32_t> ParseTokenIds(const json& value, const char* param, const ServerContext& ctx);

// The engine parameters of choice `choice_index` of `prompt` (400 when the prompt, or prompt
// plus max_tokens, exceeds the model length). `seed` seeds the request when it gave none.
runtime::RequestParams MakeRequestParams(const SamplingRequest& request, const PromptInput& prompt,
                                         int64_t choice_index, uint64_t seed,
                                         const ServerContext& ctx);

}  // namespace afd::server::api

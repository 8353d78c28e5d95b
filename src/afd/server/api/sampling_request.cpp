#include "afd/server/api/sampling_request.h"

#include "afd/server/api/api_error.h"

namespace afd::server::api {

namespace {

// Fields this server does not implement: accepted only at their neutral value.
void RejectUnsupported(const json& body) {
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (NumberField(body, name, 0.0) != 0.0) {
      ThrowBadRequest(name, "'{}' is not supported by this server (only 0)", name);
    }
  }
  if (NumberField(body, "repetition_penalty", 1.0) != 1.0) {
    ThrowBadRequest("repetition_penalty", "'repetition_penalty' is not supported (only 1)");
  }
  // vLLM's sampling extensions this engine does not implement: refused unless neutral.
  if (NumberField(body, "min_p", 0.0) != 0.0) {
    ThrowBadRequest("min_p", "'min_p' is not supported by this server (only 0)");
  }
  if (NumberField(body, "length_penalty", 1.0) != 1.0) {
    ThrowBadRequest("length_penalty", "'length_penalty' is not supported (only 1)");
  }
  if (BoolField(body, "use_beam_search", false)) {
    ThrowBadRequest("use_beam_search", "beam search is not supported by this server");
  }
  if (IntField(body, "priority", 0) != 0) {
    ThrowBadRequest("priority",
                    "'priority' needs priority scheduling, which this server does not have "
                    "(only 0)");
  }
  for (const char* name : {"allowed_token_ids", "bad_words", "logits_processors"}) {
    if (const json* f = FindField(body, name); f != nullptr && !f->is_null() && !f->empty()) {
      ThrowBadRequest(name, "'{}' is not supported by this server", name);
    }
  }
  if (IntField(body, "min_tokens", 0) != 0) {
    ThrowBadRequest("min_tokens", "'min_tokens' is not supported by this server (only 0)");
  }
  if (const json* bias = FindField(body, "logit_bias"); bias != nullptr && !bias->empty()) {
    ThrowBadRequest("logit_bias", "'logit_bias' is not supported by this server");
  }
  if (!StringField(body, "suffix", "").empty()) {
    ThrowBadRequest("suffix", "'suffix' is not supported by this server");
  }
  // Structured outputs and tool calls (issue 66 lands them): refused until then, never answered
  // with free text.
  for (const char* name :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}) {
    if (const json* f = FindField(body, name); f != nullptr && !f->is_null()) {
      ThrowBadRequest(name, "'{}' (structured outputs) is not supported by this server yet", name);
    }
  }
  if (const json* tools = FindField(body, "tools"); tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) ThrowBadRequest("tools", "'tools' must be a list of tools");
    const json* choice = FindField(body, "tool_choice");
    const bool none = choice != nullptr && choice->is_string() && *choice == "none";
    if (!tools->empty() && !none) {
      ThrowBadRequest("tool_choice",
                      "tool calls are not supported by this server yet: with 'tools', set "
                      "'tool_choice' to \"none\" (the tools then only reach the chat template)");
    }
  } else if (const json* choice = FindField(body, "tool_choice");
             choice != nullptr && !choice->is_null() &&
             !(choice->is_string() && *choice == "none")) {
    ThrowBadRequest("tool_choice", "'tool_choice' needs 'tools'");
  }
  if (const json* t = FindField(body, "chat_template"); t != nullptr && !t->is_null()) {
    ThrowBadRequest("chat_template",
                    "a request's own 'chat_template' is not accepted (as vLLM without "
                    "--trust-request-chat-template): the server renders with its model's template");
  }
  if (const json* format = FindField(body, "response_format"); format != nullptr) {
    if (!format->is_object() || format->value("type", "text") != "text") {
      ThrowBadRequest("response_format", "only {{\"type\": \"text\"}} is supported");
    }
  }
}

std::vector<std::string> ParseStop(const json& body) {
  const json* stop = FindField(body, "stop");
  if (stop == nullptr) return {};
  std::vector<std::string> out;
  if (stop->is_string()) {
    out.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    for (const auto& s : *stop) {
      if (!s.is_string()) ThrowBadRequest("stop", "'stop' must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    ThrowBadRequest("stop", "'stop' must be a string or a list of strings");
  }
  for (const auto& s : out) {
    if (s.empty()) ThrowBadRequest("stop", "stop strings must not be empty");
  }
  return out;
}

}  // namespace

std::vector<int32_t> ParseTokenIds(const json& value, const char* param, const ServerContext& ctx) {
  if (!value.is_array()) ThrowBadRequest(param, "'{}' must be a list of token ids", param);
  const int64_t vocab = ctx.engine().model_info().vocab_size;
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const auto& v : value) {
    if (!v.is_number_integer()) {
      ThrowBadRequest(param, "'{}' must hold integer token ids, got {}", param, v.dump());
    }
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= vocab) {
      ThrowBadRequest(param, "token id {} in '{}' is out of vocabulary (vocab size {})", id, param,
                      vocab);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

SamplingRequest ParseSamplingRequest(const json& body, Endpoint endpoint, const ServerContext& ctx,
                                     const HttpRequest& http) {
  SamplingRequest r;
  r.request_id = http.Header("x-request-id");
  if (r.request_id.empty()) r.request_id = StringField(body, "request_id", "");
  r.model = StringField(body, "model", "");
  ctx.CheckModel(r.model);
  RejectUnsupported(body);
  if (const json* p = FindField(body, "prompt_logprobs"); p != nullptr && !p->is_null()) {
    ThrowBadRequest("prompt_logprobs",
                    "'prompt_logprobs' is not supported by this server yet (the prompt tokens' "
                    "ranks are not computed); /v1/completions gives them with echo and logprobs");
  }

  r.n = IntField(body, "n", 1);
  if (r.n < 1) ThrowBadRequest("n", "n must be at least 1, got {}.", r.n);
  if (r.n > 1024) ThrowBadRequest("n", "n must be at most 1024, got {}.", r.n);
  const int64_t best_of = IntField(body, "best_of", r.n);
  if (best_of != r.n) ThrowBadRequest("best_of", "'best_of' other than n is not supported");

  // Chat: max_completion_tokens (OpenAI's newer name) wins over the deprecated max_tokens.
  const char* max_name = "max_tokens";
  if (endpoint == Endpoint::kChat && FindField(body, "max_completion_tokens") != nullptr) {
    max_name = "max_completion_tokens";
  }
  const ApiServerOptions::RequestDefaults& defaults = ctx.options().defaults;
  if (FindField(body, max_name) != nullptr) {
    r.max_tokens = IntField(body, max_name, 0);
    if (*r.max_tokens < 1) {
      ThrowBadRequest(max_name, "{} must be at least 1, got {}.", max_name, *r.max_tokens);
    }
  } else if (defaults.max_tokens) {
    r.max_tokens = defaults.max_tokens;
  } else if (endpoint == Endpoint::kCompletions) {
    r.max_tokens = kCompletionsDefaultMaxTokens;  // OpenAI's legacy default, as vLLM's
  }

  const double temperature = NumberField(body, "temperature", defaults.temperature.value_or(1.0));
  if (!(temperature >= 0.0) || temperature > 1.0e6) {
    ThrowBadRequest("temperature", "temperature must be non-negative, got {}.", temperature);
  }
  const double top_p = NumberField(body, "top_p", defaults.top_p.value_or(1.0));
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    ThrowBadRequest("top_p", "top_p must be in (0, 1], got {}.", top_p);
  }
  const int64_t top_k = IntField(body, "top_k", defaults.top_k.value_or(0));
  if (top_k < -1) {
    ThrowBadRequest("top_k", "top_k must be -1 or 0 (disable), or at least 1, got {}.", top_k);
  }
  r.sampling.temperature = static_cast<float>(temperature);
  r.sampling.top_p = static_cast<float>(top_p);
  r.sampling.top_k = top_k < 0 ? 0 : top_k;
  if (FindField(body, "seed") != nullptr) {
    r.has_seed = true;
    r.sampling.seed = static_cast<uint64_t>(IntField(body, "seed", 0));
  } else if (defaults.seed) {
    r.has_seed = true;
    r.sampling.seed = *defaults.seed;
  }

  r.stop = ParseStop(body);
  if (!r.stop.empty() && ctx.tokenizer() == nullptr) {
    ThrowBadRequest("stop", "stop strings need a tokenizer; this server has none");
  }
  if (const json* ids = FindField(body, "stop_token_ids"); ids != nullptr) {
    r.stop_token_ids = ParseTokenIds(*ids, "stop_token_ids", ctx);
  }
  r.ignore_eos = BoolField(body, "ignore_eos", defaults.ignore_eos);
  r.skip_special_tokens = BoolField(body, "skip_special_tokens", true);
  r.include_stop_str_in_output = BoolField(body, "include_stop_str_in_output", false);
  r.return_tokens_as_token_ids = BoolField(body, "return_tokens_as_token_ids", false);
  r.add_special_tokens = BoolField(body, "add_special_tokens", endpoint == Endpoint::kCompletions);
  if (const json* t = FindField(body, "truncate_prompt_tokens"); t != nullptr && !t->is_null()) {
    const int64_t k = IntField(body, "truncate_prompt_tokens", 0);
    if (k == 0 || k < -1) {
      ThrowBadRequest("truncate_prompt_tokens",
                      "truncate_prompt_tokens must be an integer >= 1 or -1, got {}", k);
    }
    const int64_t max_len = ctx.engine().model_info().max_model_len;
    if (max_len > 0 && k > max_len) {
      ThrowBadRequest("truncate_prompt_tokens",
                      "truncate_prompt_tokens value ({}) is greater than max_model_len ({}). "
                      "Please, select a smaller truncation size.",
                      k, max_len);
    }
    // -1: up to the model length (nothing to cut while it is not known yet).
    if (k > 0 || max_len > 0) r.truncate_prompt_tokens = k < 0 ? max_len : k;
  }

  const int32_t max_logprobs = ctx.options().max_logprobs;
  if (endpoint == Endpoint::kCompletions) {
    if (FindField(body, "logprobs") != nullptr) {
      const int64_t k = IntField(body, "logprobs", 0);
      if (k < 0 || k > max_logprobs) {
        ThrowBadRequest("logprobs", "logprobs must be in [0, {}] (--max-logprobs), got {}.",
                        max_logprobs, k);
      }
      r.logprobs = static_cast<int32_t>(k);
    }
    r.echo = BoolField(body, "echo", false);
  } else {
    const bool logprobs = BoolField(body, "logprobs", false);
    const bool has_top = FindField(body, "top_logprobs") != nullptr;
    const int64_t top = IntField(body, "top_logprobs", 0);
    if (has_top && !logprobs) {
      ThrowBadRequest("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.");
    }
    if (top < 0 || top > max_logprobs) {
      ThrowBadRequest("top_logprobs", "top_logprobs must be in [0, {}] (--max-logprobs), got {}.",
                      max_logprobs, top);
    }
    if (logprobs) r.logprobs = static_cast<int32_t>(top);
    if (BoolField(body, "echo", false)) {
      ThrowBadRequest("echo", "'echo' is not supported on chat completions by this server");
    }
  }

  r.stream = BoolField(body, "stream", false);
  if (const json* options = FindField(body, "stream_options"); options != nullptr) {
    if (!r.stream) {
      ThrowBadRequest("stream_options", "Stream options can only be defined when `stream=True`.");
    }
    if (!options->is_object()) {
      ThrowBadRequest("stream_options", "'stream_options' must be an object");
    }
    r.include_usage = BoolField(*options, "include_usage", false);
    // vLLM's continuous_usage_stats: a usage on every chunk, when include_usage is set too.
    r.continuous_usage = r.include_usage && BoolField(*options, "continuous_usage_stats", false);
  }
  r.return_token_ids = BoolField(body, "return_token_ids", false);
  if (const json* kv = FindField(body, "kv_transfer_params"); kv != nullptr) {
    if (!kv->is_object()) {
      ThrowBadRequest("kv_transfer_params", "'kv_transfer_params' must be an object");
    }
    r.kv.remote_decode = BoolField(*kv, "do_remote_decode", false);
    r.kv.remote_prefill = BoolField(*kv, "do_remote_prefill", false);
    const std::optional<KvTransferConfig>& config = ctx.options().kv_transfer;
    if (r.kv.remote_decode && r.kv.remote_prefill) {
      ThrowBadRequest("kv_transfer_params",
                      "do_remote_decode and do_remote_prefill cannot both be true");
    }
    if ((r.kv.remote_decode || r.kv.remote_prefill) && r.n != 1) {
      ThrowBadRequest("kv_transfer_params", "KV transfers take n = 1, got {}", r.n);
    }
    // The decode leg computes only the last prompt token: it cannot give the prompt's
    // log-probabilities. Refused on both legs, so that a prefill never runs for a decode leg
    // that would be refused.
    if ((r.kv.remote_decode || r.kv.remote_prefill) && r.echo && r.logprobs >= 0) {
      ThrowBadRequest("echo",
                      "echo with logprobs (the prompt's log-probabilities) cannot be served with a "
                      "KV transfer: the decode instance does not compute the prompt");
    }
    if (r.kv.remote_decode) {
      if (!config || !config->produces()) {
        ThrowBadRequest("kv_transfer_params.do_remote_decode",
                        "this server is not a KV producer (--kv-transfer-config kv_role "
                        "kv_producer or kv_both)");
      }
      if (r.stream) {
        ThrowBadRequest("kv_transfer_params.do_remote_decode",
                        "the prefill leg of a KV transfer is not streamed (stream false)");
      }
    }
    if (r.kv.remote_prefill) {
      if (!config || !config->consumes()) {
        ThrowBadRequest("kv_transfer_params.do_remote_prefill",
                        "this server is not a KV consumer (--kv-transfer-config kv_role "
                        "kv_consumer or kv_both)");
      }
      r.kv.remote_engine_id = StringField(*kv, "remote_engine_id", "");
      r.kv.remote_host = StringField(*kv, "remote_host", "");
      if (r.kv.remote_host.empty()) {
        ThrowBadRequest("kv_transfer_params.remote_host",
                        "'remote_host' is required with do_remote_prefill");
      }
      const int64_t port = IntField(*kv, "remote_port", 0);
      if (port < 1 || port > 65535) {
        ThrowBadRequest("kv_transfer_params.remote_port",
                        "'remote_port' must be a port number (1-65535), got {}", port);
      }
      r.kv.remote_port = static_cast<int>(port);
      const json* id = FindField(*kv, "remote_request_id");
      if (id == nullptr || !id->is_number_unsigned()) {
        ThrowBadRequest("kv_transfer_params.remote_request_id",
                        "'remote_request_id' (the producer's response gives it) must be a "
                        "non-negative integer");
      }
      r.kv.remote_request_id = id->get<uint64_t>();
      if (IntField(*kv, "tp_size", 1) != 1) {
        ThrowBadRequest("kv_transfer_params.tp_size",
                        "rows from a tensor-parallel producer are not supported (tp_size 1)");
      }
    }
  }
  return r;
}

std::string ResponseId(ServerContext& ctx, const SamplingRequest& request,
                       const std::string& prefix) {
  return request.request_id.empty() ? ctx.RandomId(prefix) : prefix + request.request_id;
}

PromptInput TruncatePrompt(PromptInput prompt, const SamplingRequest& request) {
  if (request.truncate_prompt_tokens &&
      static_cast<int64_t>(prompt.ids.size()) > *request.truncate_prompt_tokens) {
    prompt.ids.erase(prompt.ids.begin(), prompt.ids.end() - *request.truncate_prompt_tokens);
  }
  return prompt;
}

runtime::RequestParams MakeRequestParams(const SamplingRequest& request, const PromptInput& prompt,
                                         int64_t choice_index, uint64_t seed,
                                         const ServerContext& ctx) {
  const EngineModelInfo& info = ctx.engine().model_info();
  const int64_t prompt_len = static_cast<int64_t>(prompt.ids.size());
  if (prompt_len == 0) throw ApiError(400, "the prompt is empty (no tokens)", "prompt");
  if (prompt_len >= info.max_model_len) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, "
                               "your request has {} input tokens. Please reduce the length "
                               "of the input messages.",
                               info.max_model_len, prompt_len),
                   "prompt");
  }
  const int64_t max_tokens = request.max_tokens.value_or(info.max_model_len - prompt_len);
  if (prompt_len + max_tokens > info.max_model_len) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, "
                               "you requested {} tokens ({} in the messages, {} in the "
                               "completion). Please reduce the length of the messages or "
                               "completion.",
                               info.max_model_len, prompt_len + max_tokens, prompt_len, max_tokens),
                   "max_tokens");
  }
  runtime::RequestParams p;
  p.prompt = prompt.ids;
  p.max_tokens = max_tokens;
  p.sampling = request.sampling;
  if (!request.has_seed) p.sampling.seed = seed;
  p.sampler_stream = choice_index;
  p.stop_token_ids = request.stop_token_ids;
  p.ignore_eos = request.ignore_eos;
  p.logprobs = request.logprobs;
  if (request.echo && request.logprobs >= 0) p.prompt_logprobs = request.logprobs;
  // The prefill leg of a KV transfer: its rows stay held for the consumer.
  if (request.kv.remote_decode) {
    p.hold_kv_s = ctx.options().kv_transfer->hold_timeout_s;
    p.hold_kv_on_device =
        ctx.options().kv_transfer->transport == KvTransferConfig::Transport::kCudaIpc;
  }
  return p;
}

}  // namespace afd::server::api

// POST /v1/completions.
#include <ctime>

#include "afd/server/api/handlers.h"
#include "afd/server/api/http_util.h"
#include "afd/server/api/kv_pulls.h"
#include "afd/server/api/logprobs_format.h"
#include "afd/server/api/sampling_request.h"

namespace afd::server::api {

namespace {

PromptInput TextPrompt(const ServerContext& ctx, const json& text, bool add_special_tokens) {
  if (ctx.tokenizer() == nullptr) {
    ThrowBadRequest("prompt",
                    "text prompts need a tokenizer; this server has none: send token ids");
  }
  PromptInput p;
  p.text = text.get<std::string>();
  for (uint32_t id : ctx.tokenizer()->Encode(p.text, add_special_tokens)) {
    p.ids.push_back(static_cast<int32_t>(id));
  }
  return p;
}

PromptInput IdsPrompt(const ServerContext& ctx, const json& ids) {
  PromptInput p;
  p.ids = ParseTokenIds(ids, "prompt", ctx);
  if (ctx.tokenizer() != nullptr) {
    p.text = ctx.tokenizer()->Decode({p.ids.begin(), p.ids.end()}, /*skip_special_tokens=*/false);
  }
  return p;
}

// "prompt": a string, a list of ids, a list of strings, or a list of lists of ids.
std::vector<PromptInput> ParsePrompts(const ServerContext& ctx, const json& body,
                                      const SamplingRequest& r) {
  const json* prompt = FindField(body, "prompt");
  if (prompt == nullptr) ThrowBadRequest("prompt", "'prompt' is required");
  if (prompt->is_string())
    return {TruncatePrompt(TextPrompt(ctx, *prompt, r.add_special_tokens), r)};
  if (!prompt->is_array() || prompt->empty()) {
    ThrowBadRequest("prompt",
                    "'prompt' must be a string, a list of token ids, or a non-empty "
                    "list of either");
  }
  if ((*prompt)[0].is_number()) return {TruncatePrompt(IdsPrompt(ctx, *prompt), r)};
  std::vector<PromptInput> out;
  for (const auto& p : *prompt) {
    if (p.is_string()) {
      out.push_back(TruncatePrompt(TextPrompt(ctx, p, r.add_special_tokens), r));
    } else if (p.is_array()) {
      out.push_back(TruncatePrompt(IdsPrompt(ctx, p), r));
    } else {
      ThrowBadRequest("prompt", "'prompt' list entries must be strings or lists of token ids");
    }
  }
  return out;
}

// The logprobs of choice `c` (prompt ones first with echo), null when not requested.
json ChoiceLogprobs(const ServerContext& ctx, const SamplingRequest& r, const RequestRun& run,
                    size_t c) {
  if (r.logprobs < 0) return nullptr;
  const ChoiceState& choice = run.choice(c);
  int64_t offset = 0;
  json out = CompletionLogprobs(LogprobsTokenizer(ctx, r), {}, {}, &offset);
  if (r.echo) {
    std::vector<const runtime::TokenLogprobs*> lps;
    for (size_t i = 0; i < choice.prompt_logprobs().size(); ++i) {
      lps.push_back(i == 0 ? nullptr : &choice.prompt_logprobs()[i]);
    }
    AppendCompletionLogprobs(
        out, CompletionLogprobs(LogprobsTokenizer(ctx, r), run.prompt(c), lps, &offset));
  }
  std::vector<const runtime::TokenLogprobs*> lps;
  for (const auto& lp : choice.logprobs()) lps.push_back(&lp);
  AppendCompletionLogprobs(
      out, CompletionLogprobs(LogprobsTokenizer(ctx, r), choice.token_ids(), lps, &offset));
  return out;
}

// Per choice, what the stream has sent so far.
struct StreamChoice {
  bool first = true;
  int64_t text_offset = 0;
};

// The request submitted (with a decode leg's pulled rows) and its response.
HandlerResult Respond(const std::shared_ptr<ServerContext>& ctx, const SamplingRequest& r,
                      const std::vector<PromptInput>& prompts,
                      std::shared_ptr<const runtime::KvRows> imported) {
  const std::shared_ptr<RequestRun> run = SubmitChoices(ctx, r, prompts, std::move(imported));

  const std::string id = ResponseId(*ctx, r, "cmpl-");
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const std::string model = ctx->model_name();
  const size_t num_prompts = prompts.size();
  auto prompt_text = [prompts, n = r.n](size_t c) { return prompts[c / n].text; };

  if (!r.stream) {
    auto complete = [ctx, r, run, id, created, model, num_prompts, prompt_text] {
      json choices = json::array();
      for (size_t c = 0; c < run->num_choices(); ++c) {
        const ChoiceState& choice = run->choice(c);
        json out = {{"index", c},
                    {"text", (r.echo ? prompt_text(c) : std::string()) + choice.text()},
                    {"logprobs", ChoiceLogprobs(*ctx, r, *run, c)},
                    {"finish_reason", choice.finish_reason()},
                    {"stop_reason", choice.stop_reason()}};
        if (r.return_token_ids) {
          out["prompt_token_ids"] = run->prompt(c);
          out["token_ids"] = choice.token_ids();
        }
        choices.push_back(std::move(out));
      }
      json response = {{"id", id},
                       {"object", "text_completion"},
                       {"created", created},
                       {"model", model},
                       {"choices", std::move(choices)},
                       {"usage", Usage(*run, num_prompts, r.n)}};
      if (r.kv.remote_decode) response["kv_transfer_params"] = KvTransferResponse(*ctx, *run);
      return response;
    };
    return {{}, std::make_shared<GenerationResponse>(ctx, run, std::move(complete))};
  }

  auto sent = std::make_shared<std::vector<StreamChoice>>(run->num_choices());
  json head = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}};
  StreamFormat format;
  format.initial = [] { return std::vector<json>{}; };
  format.delta = [ctx, r, run, sent, head, prompt_text](size_t c, const ChoiceDelta& d) {
    StreamChoice& s = (*sent)[c];
    const ChoiceState& choice = run->choice(c);
    std::string text = d.text;
    json logprobs = nullptr;
    if (r.logprobs >= 0) {
      logprobs = CompletionLogprobs(LogprobsTokenizer(*ctx, r), {}, {}, &s.text_offset);
      if (s.first && r.echo) {
        std::vector<const runtime::TokenLogprobs*> lps;
        for (size_t i = 0; i < choice.prompt_logprobs().size(); ++i) {
          lps.push_back(i == 0 ? nullptr : &choice.prompt_logprobs()[i]);
        }
        AppendCompletionLogprobs(logprobs, CompletionLogprobs(LogprobsTokenizer(*ctx, r),
                                                              run->prompt(c), lps, &s.text_offset));
      }
      std::vector<const runtime::TokenLogprobs*> lps;
      for (const auto& lp : d.logprobs) lps.push_back(&lp);
      AppendCompletionLogprobs(logprobs, CompletionLogprobs(LogprobsTokenizer(*ctx, r), d.token_ids,
                                                            lps, &s.text_offset));
    }
    if (s.first && r.echo) text = prompt_text(c) + text;
    json out = {{"index", c},
                {"text", text},
                {"logprobs", std::move(logprobs)},
                {"finish_reason", d.finished ? json(choice.finish_reason()) : json(nullptr)},
                {"stop_reason", d.finished ? choice.stop_reason() : json(nullptr)}};
    if (r.return_token_ids) {
      if (s.first) out["prompt_token_ids"] = run->prompt(c);
      out["token_ids"] = d.token_ids;
    }
    s.first = false;
    json chunk = head;
    chunk["choices"] = json::array({std::move(out)});
    if (r.continuous_usage) chunk["usage"] = ChoiceUsage(*run, c);
    return std::vector<json>{std::move(chunk)};
  };
  format.usage = [run, head, num_prompts, n = r.n] {
    json chunk = head;
    chunk["choices"] = json::array();
    chunk["usage"] = Usage(*run, num_prompts, n);
    return chunk;
  };
  return {{}, std::make_shared<GenerationResponse>(ctx, run, std::move(format), r.include_usage)};
}

}  // namespace

HandlerResult HandleCompletions(const std::shared_ptr<ServerContext>& ctx, const HttpRequest& req) {
  const json body = ParseBody(req.body);
  const SamplingRequest r = ParseSamplingRequest(body, Endpoint::kCompletions, *ctx, req);
  const std::vector<PromptInput> prompts = ParsePrompts(*ctx, body, r);
  return RunWithKvRows(ctx, r, prompts.size(),
                       [ctx, r, prompts](std::shared_ptr<const runtime::KvRows> rows) {
                         return Respond(ctx, r, prompts, std::move(rows));
                       });
}

}  // namespace afd::server::api

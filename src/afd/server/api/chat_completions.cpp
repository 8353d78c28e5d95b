// POST /v1/chat/completions: messages through the tokenizer's chat template.
#include <ctime>

#include "afd/common/error.h"
#include "afd/server/api/chat_prompt.h"
#include "afd/server/api/handlers.h"
#include "afd/server/api/http_util.h"
#include "afd/server/api/kv_pulls.h"
#include "afd/server/api/logprobs_format.h"
#include "afd/server/api/sampling_request.h"

namespace afd::server::api {

namespace {

// The request submitted (with a decode leg's pulled rows) and its response.
HandlerResult Respond(const std::shared_ptr<ServerContext>& ctx, const SamplingRequest& r,
                      const PromptInput& prompt, std::shared_ptr<const runtime::KvRows> imported) {
  const std::shared_ptr<RequestRun> run = SubmitChoices(ctx, r, {prompt}, std::move(imported));

  const std::string id = ResponseId(*ctx, r, "chatcmpl-");
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const std::string model = ctx->model_name();
  auto logprobs_of = [ctx, r](const std::vector<int32_t>& ids,
                              const std::vector<runtime::TokenLogprobs>& lps) -> json {
    if (r.logprobs < 0) return nullptr;
    return {{"content", ChatLogprobsContent(LogprobsTokenizer(*ctx, r), ids, lps, r.logprobs)}};
  };

  if (!r.stream) {
    auto complete = [ctx, r, run, id, created, model, prompt, logprobs_of] {
      json choices = json::array();
      for (size_t c = 0; c < run->num_choices(); ++c) {
        const ChoiceState& choice = run->choice(c);
        json out = {{"index", c},
                    {"message", {{"role", "assistant"}, {"content", choice.text()}}},
                    {"logprobs", logprobs_of(choice.token_ids(), choice.logprobs())},
                    {"finish_reason", choice.finish_reason()},
                    {"stop_reason", choice.stop_reason()}};
        if (r.return_token_ids) out["token_ids"] = choice.token_ids();
        choices.push_back(std::move(out));
      }
      json response = {
          {"id", id},       {"object", "chat.completion"},   {"created", created},
          {"model", model}, {"choices", std::move(choices)}, {"usage", Usage(*run, 1, r.n)}};
      if (r.return_token_ids) response["prompt_token_ids"] = prompt.ids;
      if (r.kv.remote_decode) response["kv_transfer_params"] = KvTransferResponse(*ctx, *run);
      return response;
    };
    return {{}, std::make_shared<GenerationResponse>(ctx, run, std::move(complete))};
  }

  const json head = {
      {"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model}};
  StreamFormat format;
  // First, each choice's role (as vLLM and OpenAI).
  format.initial = [head, r, prompt, run, n = run->num_choices()] {
    std::vector<json> chunks;
    for (size_t c = 0; c < n; ++c) {
      json chunk = head;
      chunk["choices"] = json::array({{{"index", c},
                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}});
      if (r.return_token_ids) chunk["prompt_token_ids"] = prompt.ids;
      if (r.continuous_usage) chunk["usage"] = ChoiceUsage(*run, c);
      chunks.push_back(std::move(chunk));
    }
    return chunks;
  };
  format.delta = [run, head, r, logprobs_of](size_t c, const ChoiceDelta& d) {
    const ChoiceState& choice = run->choice(c);
    json out = {{"index", c},
                {"delta", {{"content", d.text}}},
                {"logprobs", logprobs_of(d.token_ids, d.logprobs)},
                {"finish_reason", d.finished ? json(choice.finish_reason()) : json(nullptr)},
                {"stop_reason", d.finished ? choice.stop_reason() : json(nullptr)}};
    if (r.return_token_ids) out["token_ids"] = d.token_ids;
    json chunk = head;
    chunk["choices"] = json::array({std::move(out)});
    if (r.continuous_usage) chunk["usage"] = ChoiceUsage(*run, c);
    return std::vector<json>{std::move(chunk)};
  };
  format.usage = [run, head, n = r.n] {
    json chunk = head;
    chunk["choices"] = json::array();
    chunk["usage"] = Usage(*run, 1, n);
    return chunk;
  };
  return {{}, std::make_shared<GenerationResponse>(ctx, run, std::move(format), r.include_usage)};
}

}  // namespace

HandlerResult HandleChatCompletions(const std::shared_ptr<ServerContext>& ctx,
                                    const HttpRequest& req) {
  const json body = ParseBody(req.body);
  const SamplingRequest r = ParseSamplingRequest(body, Endpoint::kChat, *ctx, req);
  const PromptInput prompt =
      TruncatePrompt(ChatPrompt(*ctx, body, /*default_add_special_tokens=*/false), r);
  return RunWithKvRows(ctx, r, 1, [ctx, r, prompt](std::shared_ptr<const runtime::KvRows> rows) {
    return Respond(ctx, r, prompt, std::move(rows));
  });
}

}  // namespace afd::server::api

// POST /tokenize and POST /detokenize, with vLLM's request and response shapes.
#include "afd/server/api/chat_prompt.h"
#include "afd/server/api/handlers.h"
#include "afd/server/api/http_util.h"
#include "afd/server/api/logprobs_format.h"

namespace afd::server::api {

HttpResponse HandleTokenize(const ServerContext& ctx, const HttpRequest& req) {
  const json body = ParseBody(req.body);
  ctx.CheckModel(StringField(body, "model", ""));
  if (ctx.tokenizer() == nullptr) throw ApiError(400, "this server has no tokenizer");
  std::vector<int32_t> ids;
  if (FindField(body, "messages") != nullptr) {
    ids = ChatPrompt(ctx, body, /*default_add_special_tokens=*/false).ids;
  } else {
    const json* prompt = FindField(body, "prompt");
    if (prompt == nullptr || !prompt->is_string()) {
      ThrowBadRequest("prompt", "'prompt' (a string) or 'messages' is required");
    }
    const bool add_special = BoolField(body, "add_special_tokens", true);
    for (uint32_t id : ctx.tokenizer()->Encode(prompt->get<std::string>(), add_special)) {
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  json token_strs = nullptr;
  if (BoolField(body, "return_token_strs", false)) {
    token_strs = json::array();
    for (int32_t id : ids) token_strs.push_back(TokenString(ctx.tokenizer(), id));
  }
  return JsonResponse(200, {{"count", ids.size()},
                            {"max_model_len", ctx.engine().model_info().max_model_len},
                            {"tokens", ids},
                            {"token_strs", std::move(token_strs)}});
}

HttpResponse HandleDetokenize(const ServerContext& ctx, const HttpRequest& req) {
  const json body = ParseBody(req.body);
  ctx.CheckModel(StringField(body, "model", ""));
  if (ctx.tokenizer() == nullptr) throw ApiError(400, "this server has no tokenizer");
  const json* tokens = FindField(body, "tokens");
  if (tokens == nullptr) ThrowBadRequest("tokens", "'tokens' is required");
  const std::vector<int32_t> ids = ParseTokenIds(*tokens, "tokens", ctx);
  return JsonResponse(200, {{"prompt", ctx.tokenizer()->Decode({ids.begin(), ids.end()},
                                                               /*skip_special_tokens=*/false)}});
}

}  // namespace afd::server::api

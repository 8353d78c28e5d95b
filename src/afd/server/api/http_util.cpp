#include "afd/server/api/http_util.h"

#include <chrono>

#include "afd/common/error.h"

namespace afd::server::api {

json KvTransferResponse(const ServerContext& ctx, const RequestRun& run) {
  if (run.num_choices() != 1 || !run.choice(0).kv_held()) return nullptr;
  const ChoiceState& c = run.choice(0);
  const ApiServerOptions& o = ctx.options();
  return {{"do_remote_prefill", true},
          {"do_remote_decode", false},
          {"remote_engine_id", ctx.kv_engine_id()},
          {"remote_request_id", run.sequence_id(0)},
          {"remote_block_ids", c.kv_block_ids()},
          {"remote_host", o.kv_transfer->kv_ip},
          {"remote_port", ctx.kv_port.load()},
          {"tp_size", 1},
          {"num_positions", c.kv_positions()}};
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ErrorBody(int status, const std::string& message, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", ApiError::TypeForStatus(status)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", status}}}};
}

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = Dump(body);
  return r;
}

HttpResponse ErrorResponse(const ApiError& error, int retry_after_s) {
  HttpResponse r =
      JsonResponse(error.status(), ErrorBody(error.status(), error.what(), error.param()));
  if (error.status() == 503) r.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  return r;
}

ApiError RunError(const ServerContext& ctx, const RequestRun& run) {
  if (run.rejected()) return ApiError(400, run.error());
  return ApiError(ctx.shutting_down ? 503 : 500, run.error());
}

json Usage(const RequestRun& run, size_t num_prompts, int64_t n) {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t p = 0; p < num_prompts; ++p) {
    prompt_tokens += static_cast<int64_t>(run.prompt(p * static_cast<size_t>(n)).size());
  }
  for (size_t i = 0; i < run.num_choices(); ++i) {
    completion_tokens += static_cast<int64_t>(run.choice(i).token_ids().size());
  }
  return {{"prompt_tokens", prompt_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"completion_tokens", completion_tokens}};
}

json ChoiceUsage(const RequestRun& run, size_t c) {
  const int64_t prompt_tokens = static_cast<int64_t>(run.prompt(c).size());
  const int64_t completion_tokens = static_cast<int64_t>(run.choice(c).token_ids().size());
  return {{"prompt_tokens", prompt_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"completion_tokens", completion_tokens}};
}

namespace {

void AppendEvent(std::string* out, const std::string& data) {
  out->append("data: ");
  out->append(data);
  out->append("\n\n");
}

}  // namespace

GenerationResponse::GenerationResponse(std::shared_ptr<ServerContext> ctx,
                                       std::shared_ptr<RequestRun> run, StreamFormat format,
                                       bool include_usage)
    : ctx_(std::move(ctx)),
      run_(std::move(run)),
      streamed_(true),
      format_(std::move(format)),
      include_usage_(include_usage) {}

GenerationResponse::GenerationResponse(std::shared_ptr<ServerContext> ctx,
                                       std::shared_ptr<RequestRun> run,
                                       std::function<json()> complete)
    : ctx_(std::move(ctx)),
      run_(std::move(run)),
      streamed_(false),
      complete_(std::move(complete)) {}

GenerationResponse::~GenerationResponse() {
  // Dropped before its end (the server stopped): free the sequences.
  if (!ended_) run_->Abort();
  run_->SetNotify(nullptr);
  --ctx_->in_flight;
}

void GenerationResponse::SetWaker(std::function<void()> wake) { run_->SetNotify(std::move(wake)); }

void GenerationResponse::ClientGone() {
  if (!ended_) run_->Abort();  // the client closed the request (nginx's 499; nobody reads it)
  ended_ = true;
}

bool GenerationResponse::Pump(std::string* out, HttpResponse* response) {
  if (ended_) return true;
  RequestRun& run = *run_;
  if (!streamed_) {
    while (run.NextDelta(std::chrono::milliseconds(0))) {
    }
    if (!run.done()) return false;
    ended_ = true;
    if (!run.error().empty()) {
      *response = ErrorResponse(RunError(*ctx_, run), ctx_->options().retry_after_s);
    } else {
      *response = JsonResponse(200, complete_());
    }
    return true;
  }
  if (!started_) {
    started_ = true;
    for (const auto& chunk : format_.initial()) AppendEvent(out, Dump(chunk));
  }
  while (auto delta = run.NextDelta(std::chrono::milliseconds(0))) {
    for (const auto& chunk : format_.delta(delta->first, delta->second)) {
      AppendEvent(out, Dump(chunk));
    }
  }
  const std::string error = run.error();
  if (!error.empty()) {
    run.Abort();  // the other choices end too: the stream is over
    const ApiError e = RunError(*ctx_, run);
    AppendEvent(out, Dump(ErrorBody(e.status(), e.what())));
  } else if (!run.done()) {
    return false;
  } else if (include_usage_) {
    AppendEvent(out, Dump(format_.usage()));
  }
  AppendEvent(out, "[DONE]");
  ended_ = true;
  return true;
}

std::shared_ptr<RequestRun> SubmitChoices(const std::shared_ptr<ServerContext>& ctx,
                                          const SamplingRequest& r,
                                          const std::vector<PromptInput>& prompts,
                                          std::shared_ptr<const runtime::KvRows> imported) {
  const uint64_t seed = ctx->RandomSeed();
  std::vector<runtime::RequestParams> params;
  for (const auto& prompt : prompts) {
    for (int64_t j = 0; j < r.n; ++j) params.push_back(MakeRequestParams(r, prompt, j, seed, *ctx));
  }
  if ((r.kv.remote_decode || r.kv.remote_prefill) && params.size() != 1) {
    ThrowBadRequest("kv_transfer_params", "KV transfers take one prompt, got {}", prompts.size());
  }
  // The decode leg: only what the pulled rows do not cover is computed.
  AFD_CHECK(!r.kv.remote_prefill || imported != nullptr ||
                ctx->options().kv_transfer->load_failure_policy ==
                    KvTransferConfig::LoadFailurePolicy::kRecompute,
            "a decode leg submitted without its rows (RunWithKvRows pulls them)");
  if (r.kv.remote_prefill) params[0].imported_kv = std::move(imported);
  auto run = std::make_shared<RequestRun>(ctx, r);
  const std::unique_lock<std::mutex> admitted = ctx->AdmitRequest();
  for (auto& p : params) run->Submit(std::move(p));
  return run;
}

}  // namespace afd::server::api

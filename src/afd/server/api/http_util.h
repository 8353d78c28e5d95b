// JSON responses and vLLM's error body for the endpoint handlers, and the response of a
// generation request (GenerationResponse): server-sent events as tokens arrive, or one JSON
// body once every choice is done, pumped by the HTTP server without holding a thread.
//
// Thread safety: pure functions; a GenerationResponse is driven by its connection's strand.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "afd/server/api/api_error.h"
#include "afd/server/api/http_types.h"
#include "afd/server/api/json_fields.h"
#include "afd/server/api/request_run.h"
#include "afd/server/api/sampling_request.h"

namespace afd::server::api {

// JSON text; invalid UTF-8 (never expected) is replaced rather than thrown on.
std::string Dump(const json& value);
json ErrorBody(int status, const std::string& message, const std::string& param = "");
HttpResponse JsonResponse(int status, const json& body);
// The error body; a 503 also gets Retry-After (retry_after_s).
HttpResponse ErrorResponse(const ApiError& error, int retry_after_s);

// Checks every choice's parameters, then submits n choices of each prompt (choice index =
// prompt * n + j) in one admission; a decode leg's with its pulled rows (`imported`,
// RunWithKvRows).
// The kv_transfer_params a KV producer's response carries (vLLM NixlConnector's fields, plus
// remote_request_id and num_positions): where and what to pull; null when the run held no rows.
json KvTransferResponse(const ServerContext& ctx, const RequestRun& run);

std::shared_ptr<RequestRun> SubmitChoices(
    const std::shared_ptr<ServerContext>& ctx, const SamplingRequest& r,
    const std::vector<PromptInput>& prompts,
    std::shared_ptr<const runtime::KvRows> imported = nullptr);

// The ApiError for a run whose choice failed: 400 for a request the engine refused, 503 when
// the server is shutting down, else 500.
ApiError RunError(const ServerContext& ctx, const RequestRun& run);

// How a generation endpoint writes its stream: the chunks to send first, the chunks of one delta,
// and the usage chunk (called only with stream_options.include_usage).
struct StreamFormat {
  std::function<std::vector<json>()> initial;
  std::function<std::vector<json>(size_t choice, const ChoiceDelta& delta)> delta;
  std::function<json()> usage;
};

// The response of a generation request. Streamed: "data: {json}\n\n" per chunk, an error event
// when a choice fails, then "data: [DONE]\n\n". Whole: `complete()` (the response body) once
// every choice is done, or the run's error. A client gone, or a response dropped before its
// end, aborts the run. Holds one of ctx->in_flight until destroyed.
class GenerationResponse : public PendingResponse {
 public:
  // Streamed.
  GenerationResponse(std::shared_ptr<ServerContext> ctx, std::shared_ptr<RequestRun> run,
                     StreamFormat format, bool include_usage);
  // Whole.
  GenerationResponse(std::shared_ptr<ServerContext> ctx, std::shared_ptr<RequestRun> run,
                     std::function<json()> complete);
  ~GenerationResponse() override;

  bool streamed() const override { return streamed_; }
  void SetWaker(std::function<void()> wake) override;
  bool Pump(std::string* out, HttpResponse* response) override;
  void ClientGone() override;

 private:
  std::shared_ptr<ServerContext> ctx_;
  std::shared_ptr<RequestRun> run_;
  bool streamed_;
  StreamFormat format_;
  bool include_usage_ = false;
  std::function<json()> complete_;
  bool started_ = false;
  bool ended_ = false;
};

// usage {"prompt_tokens", "completion_tokens", "total_tokens"} of a run whose choice i answers
// prompt prompt_of_choice[i]; each prompt counts once.
json Usage(const RequestRun& run, size_t num_prompts, int64_t n);
// Choice c's usage so far (stream_options.continuous_usage_stats, on each of its chunks): its
// prompt and the tokens it has generated.
json ChoiceUsage(const RequestRun& run, size_t c);

}  // namespace afd::server::api

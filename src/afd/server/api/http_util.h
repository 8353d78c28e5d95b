// JSON responses and vLLM's error body for the endpoint handlers, and the SSE stream of a
// generation request. Internal to the server (includes httplib.h).
//
// Thread safety: pure functions; StreamRun's callbacks run on the connection's thread.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "afd/server/api/api_error.h"
#include "afd/server/api/json_fields.h"
#include "afd/server/api/request_run.h"
#include "afd/server/api/sampling_request.h"

namespace afd::server::api {

// JSON text; invalid UTF-8 (never expected) is replaced rather than thrown on.
std::string Dump(const json& value);
json ErrorBody(int status, const std::string& message, const std::string& param = "");
void SendJson(httplib::Response& res, int status, const json& body);
void SendError(httplib::Response& res, const ApiError& error);

// A check that tells whether the client of `req` has closed its connection (the peer's FIN,
// seen as POLLRDHUP on the request's socket, found among this process's sockets by the
// request's addresses). cpp-httplib 0.11 gives a handler no view of its connection; without
// this a non-streaming request would run to the end after its client left. Linux only; the
// check answers false when the socket cannot be found.
std::function<bool()> ClientGoneCheck(const httplib::Request& req);

// Checks every choice's parameters, then submits n choices of each prompt (choice index =
// prompt * n + j) in one admission.
std::shared_ptr<RequestRun> SubmitChoices(const std::shared_ptr<ServerContext>& ctx,
                                          const SamplingRequest& r,
                                          const std::vector<PromptInput>& prompts);

// A non-streaming request: waits for every choice of `run`. False when the client left first
// (the run is aborted and `res` gets status 499, which nobody reads); throws the run's ApiError
// when a choice failed.
bool AwaitChoices(RequestRun& run, const ServerContext& ctx, const httplib::Request& req,
                  httplib::Response& res);

// The ApiError for a run whose choice failed: 503 when the server is shutting down, else 500.
ApiError RunError(const ServerContext& ctx, const RequestRun& run);

// How a generation endpoint writes its stream: the chunks to send first, the chunks of one delta,
// and the usage chunk (called only with stream_options.include_usage).
struct StreamFormat {
  std::function<std::vector<json>()> initial;
  std::function<std::vector<json>(size_t choice, const ChoiceDelta& delta)> delta;
  std::function<json()> usage;
};

// Answers with `run` as server-sent events: "data: {json}\n\n" per chunk, an error event when a
// choice fails, then "data: [DONE]\n\n". A failed write (client gone) aborts the run. Decrements
// ctx->in_flight when the response is over.
void StreamRun(httplib::Response& res, std::shared_ptr<ServerContext> ctx,
               std::shared_ptr<RequestRun> run, StreamFormat format, bool include_usage);

// usage {"prompt_tokens", "completion_tokens", "total_tokens"} of a run whose choice i answers
// prompt prompt_of_choice[i]; each prompt counts once.
json Usage(const RequestRun& run, size_t num_prompts, int64_t n);

}  // namespace afd::server::api

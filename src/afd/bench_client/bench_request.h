// One benchmark request: the streamed /v1/completions body vLLM's benchmark sends, and the
// client-side timing of its reply (TTFT, inter-chunk gaps, usage counts).
// Thread safety: pure / reentrant; SendCompletion may run on many threads with one client.
#pragma once

#include <string>

#include "afd/bench_client/bench_dataset.h"
#include "afd/bench_client/bench_metrics.h"
#include "afd/bench_client/http_stream_client.h"

namespace afd::bench_client {

struct CompletionSettings {
  std::string model;
  double temperature = 0.0;
  bool ignore_eos = false;
};

// {"model", "prompt" (text or ids), "max_tokens", "temperature", "stream": true,
//  "stream_options": {"include_usage": true}[, "ignore_eos": true]} as JSON text.
std::string CompletionRequestBody(const CompletionSettings& settings, const BenchPrompt& prompt);

// Sends `body` to `endpoint` and reads its stream. Content chunks are events whose "choices" is
// non-empty (vLLM's rule); the usage chunk supplies output (and, for text prompts, prompt)
// token counts. Failure: no content chunk, a non-200 reply ("HTTP 400: <message>"), an "error"
// event, a transport error or timeout. Times are from the call, start_s/queue_s left to the
// caller.
RequestOutcome SendCompletion(const HttpStreamClient& client, const std::string& endpoint,
                              const std::string& body, const BenchPrompt& prompt);

}  // namespace afd::bench_client

// The OpenAI-compatible HTTP frontend: answers /v1/completions, /v1/chat/completions,
// /v1/models, /tokenize, /detokenize, /health, /metrics and /version as vLLM's server does
// (docs/server.md lists the fields, errors and metrics, and where it differs from vLLM), turning
// each request into sequences of the EngineClient behind it.
//
// Lifecycle: construct, Start() (binds, then serves on background threads: an event-driven
// front end, http_server.h, whose bounds are docs/reliability.md's), BeginShutdown()
// (new requests get 503, in-flight ones go on), Stop() (aborts what is still in flight, which
// then ends in an error response, and joins the threads). The destructor calls Stop().
//
// Without a tokenizer, prompts must be token ids: text prompts, chat, stop strings, /tokenize
// and /detokenize are 400 errors, output `text` is empty, and logprobs name tokens
// "token_id:<id>".
//
// Thread safety: Start, BeginShutdown, Stop and port may be called from any thread; Start once.
// The engine, tokenizer and chat template must outlive the server.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afd/config/kv_transfer_config.h"
#include "afd/server/engine_client.h"

namespace afd::text {
class Tokenizer;
class ChatTemplate;
}  // namespace afd::text

namespace afd::server {

struct ApiServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: an ephemeral port (see ApiServer::port)
  std::string api_key;  // empty: no authentication; else /v1/* need "Authorization: Bearer KEY"
  // The first is the name responses report; requests may name any of them. Must not be empty.
  std::vector<std::string> served_model_names = {"model"};
  int32_t max_logprobs = 20;  // the largest `logprobs` / `top_logprobs` accepted
  // What a request that leaves a field out gets (the serve command's --max-tokens, --temperature,
  // --top-p, --top-k, --seed, --ignore-eos when given). Unset: OpenAI's and vLLM's defaults --
  // max_tokens 16 on /v1/completions and the rest of the context on chat, temperature 1,
  // top_p 1, no top-k, a random seed, stop at EOS.
  struct RequestDefaults {
    std::optional<int64_t> max_tokens;
    std::optional<double> temperature, top_p;
    std::optional<int64_t> top_k;
    std::optional<uint64_t> seed;
    bool ignore_eos = false;
  };
  RequestDefaults defaults;
  int64_t max_waiting_requests = 0;  // 0: no limit; else 503 once this many sequences wait
  int retry_after_s = 1;             // the Retry-After header of such a 503
  // The HTTP front end (http_server.h): no thread is held by an open request. I/O threads serve
  // every connection; worker threads parse, tokenize and submit requests.
  int num_io_threads = 2;
  int num_work_threads = 4;
  double header_timeout_s = 10;  // a request's headers, whole, from its connection's last event
  double body_timeout_s = 60;    // its body, from its headers
  double write_timeout_s = 60;   // each write of a response (a client that stops reading)
  // Past it: 413. 8 MiB holds several full-length prompts as token ids (a 163840-token prompt is
  // ~1.2 MB of JSON); at most num_work_threads bodies are tokenized at once.
  int64_t max_request_body_bytes = 8 * 1024 * 1024;
  int64_t max_connections = 16384;  // past it: 503 and close
  // How long Stop() lets aborted requests send their error before closing connections.
  int shutdown_grace_ms = 5000;
  // Prefill/decode disaggregation (`--kv-transfer-config`, docs/pd.md): a producer holds the
  // rows of requests with kv_transfer_params.do_remote_decode and serves them on kv_ip:kv_port
  // (kv_port 0: a free port, for tests); a consumer pulls them for requests with
  // do_remote_prefill; both sides compare the engines' EngineClient::kv_cache_layout().
  // kv_secret: the join secret transfers authenticate with (nullopt: none, loopback only).
  std::optional<KvTransferConfig> kv_transfer;
  std::optional<std::string> kv_secret;
  // Throws afd::Error naming the bad field.
  void Validate() const;
};

class ApiServer {
 public:
  // `tokenizer` and `chat_template` may be null (see above).
  ApiServer(ApiServerOptions options, EngineClient& engine, const text::Tokenizer* tokenizer,
            const text::ChatTemplate* chat_template);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds host:port and starts serving on background threads. Throws afd::Error naming
  // host:port when it cannot bind.
  void Start();
  // The bound port (the chosen one when options.port was 0); 0 before Start.
  int port() const;
  // Stops accepting requests: from now on every request but /health and /metrics gets 503
  // (and /health reports 503). Requests in flight go on.
  void BeginShutdown();
  // BeginShutdown, aborts every sequence still in the engines (their requests end in an error
  // response or stream event), waits up to shutdown_grace_ms for them, then closes the listener
  // and joins the threads. Idempotent.
  void Stop();
  // Requests being answered now (for tests and shutdown logic).
  int64_t num_in_flight() const;
  // The KV transfer server's port (a producer after Start), else 0.
  int kv_port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace afd::server

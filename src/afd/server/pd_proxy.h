// `afd proxy`: the client-facing endpoint of prefill/decode disaggregation (the deployment
// topologies' 2P1A1F, vLLM's toy proxy's flow; docs/pd.md). For each /v1/completions or
// /v1/chat/completions request: the prompt goes to a prefill instance (round robin) with max_tokens
// 1, stream false and kv_transfer_params.do_remote_decode; the kv_transfer_params of its answer go
// with the original request to a decode instance (round robin), whose answer -- streamed or not --
// is relayed to the client. An instance that refuses the connection (down: nothing was sent) is
// passed over for the next one of its kind (not for a streamed decode leg); one that fails or
// does not answer within the timeout gives the client an OpenAI-style error (its status, or 502
// naming the instance), never a hang; a decode leg no decoder took frees the prefiller's held
// rows at once (not at its hold timeout); a client that leaves a stream closes the decoder's
// (which aborts the request).
// GET /healthcheck and /health answer 200; GET /v1/models is a decoder's answer.
// Thread safety: Start once; port and Stop from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace afd::server {

struct PdProxyOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: an ephemeral port
  struct Instance {
    std::string host;
    int port = 0;
  };
  std::vector<Instance> prefillers, decoders;
  double timeout_s = 600;  // each leg, connect to last byte
  int io_threads = 2;
  int work_threads = 16;  // requests being relayed at once before others queue
  // The join secret (AFD_JOIN_SECRET / AFD_JOIN_SECRET_FILE) the prefillers' KV servers take:
  // a decode leg that no decoder took frees its rows there (nullopt: producers without one).
  std::optional<std::string> kv_secret;
  // Throws afd::Error naming the bad field.
  void Validate() const;
};

class PdProxy {
 public:
  explicit PdProxy(PdProxyOptions options);
  ~PdProxy();
  PdProxy(const PdProxy&) = delete;
  PdProxy& operator=(const PdProxy&) = delete;
  void Start();  // binds host:port (throws afd::Error naming it when it cannot)
  int port() const;
  void Stop();  // idempotent

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Serves until SIGINT / SIGTERM (blocked by the caller first), then returns 0.
int RunPdProxy(const PdProxyOptions& options);

}  // namespace afd::server

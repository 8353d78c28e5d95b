#include "afd/server/pd_proxy.h"

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "afd/common/error.h"
#include "afd/common/stop_signals.h"
#include "afd/pd/kv_transport.h"
#include "afd/server/api/api_error.h"
#include "afd/server/api/http_server.h"
#include "afd/server/api/http_util.h"

namespace afd::server {

namespace {

// A release of held rows is best effort: a producer gone or slow keeps them to its timeout.
constexpr double kReleaseTimeoutSeconds = 2;

using json = nlohmann::ordered_json;
using api::ApiError;
using api::HandlerResult;
using api::HttpRequest;
using api::HttpResponse;

std::string Name(const PdProxyOptions::Instance& i) { return fmt::format("{}:{}", i.host, i.port); }

std::unique_ptr<httplib::Client> Client(const PdProxyOptions::Instance& to, double timeout_s) {
  auto c = std::make_unique<httplib::Client>(to.host, to.port);
  const auto t = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::duration<double>(timeout_s));
  c->set_connection_timeout(t.count() / 1000000, t.count() % 1000000);
  c->set_read_timeout(t);
  c->set_write_timeout(t);
  c->set_keep_alive(false);
  return c;
}

HttpResponse ErrorOf(const ApiError& e) { return api::ErrorResponse(e, 1); }

// A decode leg's streamed answer, relayed as it arrives: a thread reads the decoder's events into
// a queue; Pump hands them out; the client's leaving stops the read (closing the decoder's
// connection, which aborts its request there).
class StreamRelay : public api::PendingResponse {
 public:
  struct Shared {
    std::mutex mu;
    std::string bytes;
    bool ended = false;
    std::function<void()> wake;
    std::atomic<bool> cancelled{false};
  };
  explicit StreamRelay(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  ~StreamRelay() override { shared_->cancelled = true; }
  bool streamed() const override { return true; }
  void SetWaker(std::function<void()> wake) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->wake = std::move(wake);
  }
  bool Pump(std::string* out, HttpResponse*) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    out->append(shared_->bytes);
    shared_->bytes.clear();
    return shared_->ended;
  }
  void ClientGone() override { shared_->cancelled = true; }

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace

void PdProxyOptions::Validate() const {
  AFD_CHECK(port >= 0 && port <= 65535, "afd proxy: --port {} is not in [0, 65535]", port);
  AFD_CHECK(!prefillers.empty(),
            "afd proxy: no prefill instance (--prefiller-hosts / "
            "--prefiller-ports)");
  AFD_CHECK(!decoders.empty(),
            "afd proxy: no decode instance (--decoder-hosts / "
            "--decoder-ports)");
  for (const auto* list : {&prefillers, &decoders}) {
    for (const Instance& i : *list) {
      AFD_CHECK(!i.host.empty() && i.port >= 1 && i.port <= 65535,
                "afd proxy: instance {} is not host:port with a port in [1, 65535]", Name(i));
    }
  }
  AFD_CHECK(timeout_s > 0, "afd proxy: --timeout-s must be > 0, got {}", timeout_s);
}

struct PdProxy::Impl {
  PdProxyOptions o;
  std::unique_ptr<api::HttpServer> http;
  std::atomic<uint64_t> next_prefiller{0}, next_decoder{0};

  // A decode leg that no decoder took: the prefiller's held rows are freed now, not at its hold
  // timeout (off the request's thread: its error goes to the client at once; best effort, a
  // producer that is gone has nothing to free).
  void ReleaseHeld(const json& params) const {
    const json* host =
        params.is_object() && params.contains("remote_host") ? &params["remote_host"] : nullptr;
    if (host == nullptr || !host->is_string() || !params.contains("remote_port") ||
        !params["remote_port"].is_number_integer() || !params.contains("remote_request_id") ||
        !params["remote_request_id"].is_number_unsigned()) {
      return;
    }
    const std::string h = host->get<std::string>();
    const int port = params["remote_port"].get<int>();
    const uint64_t id = params["remote_request_id"].get<uint64_t>();
    const std::optional<std::string> secret = o.kv_secret;
    std::thread([h, port, id, secret] {
      try {
        pd::ReleaseKvRows(h, port, id, secret, kReleaseTimeoutSeconds);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "afd proxy: could not free request %llu's KV rows at %s:%d: %s\n",
                     static_cast<unsigned long long>(id), h.c_str(), port, e.what());
      }
    }).detach();
  }

  // POSTs `payload` (GETs when it is null) to the next instance of `list` in round-robin
  // order; one that refuses the connection (nothing was sent: it is down) is passed over for the
  // next, each tried once. `*used`: the instance that answered, or the last one tried.
  httplib::Result PostToNext(const std::vector<PdProxyOptions::Instance>& list,
                             std::atomic<uint64_t>& next, const std::string& path,
                             const std::string* payload, const PdProxyOptions::Instance** used) {
    const uint64_t first = next++;
    for (size_t k = 0;; ++k) {
      *used = &list[(first + k) % list.size()];
      auto client = Client(**used, o.timeout_s);
      httplib::Result r =
          payload ? client->Post(path, *payload, "application/json") : client->Get(path);
      if (r || r.error() != httplib::Error::Connection || k + 1 == list.size()) return r;
    }
  }

  // GET /v1/models: the decoders' answer (they serve the model the client names).
  HandlerResult Models(const HttpRequest& req) {
    const PdProxyOptions::Instance* used = nullptr;
    const httplib::Result r = PostToNext(o.decoders, next_decoder, req.path, nullptr, &used);
    if (!r) {
      return {ErrorOf(ApiError(502, fmt::format("the decode instance {} did not answer: {}",
                                                Name(*used), httplib::to_string(r.error())))),
              nullptr};
    }
    HttpResponse out;
    out.status = r->status;
    out.body = r->body;
    return {out, nullptr};
  }

  HandlerResult Relay(const HttpRequest& req) {
    if (req.method == "GET") return Models(req);
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object()) {
      return {ErrorOf(ApiError(400, "the request body must be a JSON object")), nullptr};
    }
    const bool chat = req.path == "/v1/chat/completions";
    const bool stream =
        body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
    // The prefill leg.
    json prefill = body;
    prefill["max_tokens"] = 1;
    if (chat && prefill.contains("max_completion_tokens")) prefill["max_completion_tokens"] = 1;
    prefill["stream"] = false;
    prefill.erase("stream_options");
    prefill["kv_transfer_params"] = {{"do_remote_decode", true},    {"do_remote_prefill", false},
                                     {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                     {"remote_host", nullptr},      {"remote_port", nullptr}};
    const PdProxyOptions::Instance* used = nullptr;
    const std::string prefill_body = prefill.dump();
    const httplib::Result pr =
        PostToNext(o.prefillers, next_prefiller, req.path, &prefill_body, &used);
    const PdProxyOptions::Instance& p = *used;
    if (!pr) {
      return {ErrorOf(ApiError(502, fmt::format("the prefill instance {} did not answer: {}",
                                                Name(p), httplib::to_string(pr.error())))),
              nullptr};
    }
    if (pr->status != 200) {  // its own error, as it gave it
      HttpResponse r;
      r.status = pr->status;
      r.body = pr->body;
      return {r, nullptr};
    }
    const json answer = json::parse(pr->body, nullptr, false);
    if (!answer.is_object() || !answer.contains("kv_transfer_params") ||
        !answer["kv_transfer_params"].is_object()) {
      return {ErrorOf(ApiError(502, fmt::format("the prefill instance {} returned no "
                                                "kv_transfer_params (is it a KV producer?)",
                                                Name(p)))),
              nullptr};
    }
    // The decode leg.
    json decode = body;
    decode["kv_transfer_params"] = answer["kv_transfer_params"];
    const json held = answer["kv_transfer_params"];
    if (!stream) {
      const std::string decode_body = decode.dump();
      const httplib::Result dr =
          PostToNext(o.decoders, next_decoder, req.path, &decode_body, &used);
      const PdProxyOptions::Instance& d = *used;
      if (!dr) {
        ReleaseHeld(held);
        return {ErrorOf(ApiError(502, fmt::format("the decode instance {} did not answer: {}",
                                                  Name(d), httplib::to_string(dr.error())))),
                nullptr};
      }
      if (dr->status != 200) ReleaseHeld(held);  // (a no-op for rows the decoder pulled)
      HttpResponse r;
      r.status = dr->status;
      r.body = dr->body;
      return {r, nullptr};
    }
    // Streamed: wait for the decoder's status; a 200 is relayed event by event, anything else
    // answered whole. (One decoder, round-robin: a streamed leg is not retried elsewhere.)
    const PdProxyOptions::Instance& d = o.decoders[next_decoder++ % o.decoders.size()];
    auto shared = std::make_shared<StreamRelay::Shared>();
    auto status = std::make_shared<std::promise<int>>();
    std::future<int> status_future = status->get_future();
    auto error_body = std::make_shared<std::string>();
    const std::string path = req.path, payload = decode.dump();
    const double timeout = o.timeout_s;
    std::thread([d, path, payload, timeout, shared, status, error_body] {
      bool status_set = false;
      int code = 0;
      httplib::Request up;
      up.method = "POST";
      up.path = path;
      up.body = payload;
      up.set_header("Content-Type", "application/json");
      up.set_header("Accept", "text/event-stream");
      up.response_handler = [&](const httplib::Response& res) {
        code = res.status;
        if (code == 200) {
          status->set_value(200);
          status_set = true;
        }
        return true;
      };
      up.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (code != 200) {
          error_body->append(data, n);
          return true;
        }
        std::function<void()> wake;
        {
          std::lock_guard<std::mutex> lock(shared->mu);
          shared->bytes.append(data, n);
          wake = shared->wake;
        }
        if (wake) wake();
        return !shared->cancelled.load();
      };
      const httplib::Result r = Client(d, timeout)->send(up);
      if (!status_set) status->set_value(r ? code : 0);
      std::function<void()> wake;
      {
        std::lock_guard<std::mutex> lock(shared->mu);
        if (status_set && !r && !shared->cancelled) {
          // The decoder went away mid-stream: an error event, then the end.
          shared->bytes += "data: " +
                           json{{"error",
                                 {{"message", fmt::format("the decode instance {}:{} "
                                                          "stopped answering",
                                                          d.host, d.port)},
                                  {"type", "BadGatewayError"},
                                  {"code", 502}}}}
                               .dump() +
                           "\n\ndata: [DONE]\n\n";
        }
        shared->ended = true;
        wake = shared->wake;
      }
      if (wake) wake();
    }).detach();
    const int code = status_future.get();  // bounded by the leg's timeout
    if (code == 200) return {{}, std::make_shared<StreamRelay>(shared)};
    ReleaseHeld(held);
    if (code == 0) {
      return {ErrorOf(ApiError(502, fmt::format("the decode instance {} did not answer", Name(d)))),
              nullptr};
    }
    // The status of a failed answer is set after its whole body was read (the future orders it).
    HttpResponse r;
    r.status = code;
    r.body = *error_body;
    return {r, nullptr};
  }
};

PdProxy::PdProxy(PdProxyOptions options) : impl_(std::make_shared<Impl>()) {
  options.Validate();
  impl_->o = std::move(options);
  api::HttpServerOptions h;
  h.host = impl_->o.host;
  h.port = impl_->o.port;
  h.io_threads = impl_->o.io_threads;
  h.work_threads = impl_->o.work_threads;
  api::HttpHandlers handlers;
  Impl* impl = impl_.get();
  handlers.inline_route = [](const HttpRequest& req, HandlerResult* out) {
    if (req.method == "GET" && (req.path == "/healthcheck" || req.path == "/health")) {
      out->response.body = R"({"status":"ok"})";
      return true;
    }
    if (req.method == "GET" && req.path == "/v1/models") return false;  // the decoders'
    const bool relayed = req.path == "/v1/completions" || req.path == "/v1/chat/completions";
    if (relayed && req.method == "POST") return false;
    *out = {ErrorOf(ApiError(relayed ? 405 : 404,
                             fmt::format("{}: {} {}", relayed ? "Method Not Allowed" : "Not Found",
                                         req.method, req.path))),
            nullptr};
    return true;
  };
  handlers.work = [impl](const HttpRequest& req) { return impl->Relay(req); };
  handlers.error = [](int status, const std::string& message) {
    return ErrorOf(ApiError(status, message));
  };
  impl_->http = std::make_unique<api::HttpServer>(std::move(h), std::move(handlers));
}

PdProxy::~PdProxy() { Stop(); }
void PdProxy::Start() { impl_->http->Start(); }
int PdProxy::port() const { return impl_->http->port(); }
void PdProxy::Stop() { impl_->http->Stop(); }

int RunPdProxy(const PdProxyOptions& options) {
  PdProxy proxy(options);
  proxy.Start();
  std::cerr << fmt::format(
                   "afd proxy: listening on http://{}:{} ({} prefill, {} decode "
                   "instances)",
                   options.host, proxy.port(), options.prefillers.size(), options.decoders.size())
            << std::endl;
  while (true) {
    if (const int sig = WaitStopSignal(0.5)) {
      std::cerr << "afd proxy: " << StopSignalName(sig) << ": stopping" << std::endl;
      proxy.Stop();
      return 0;
    }
  }
}

}  // namespace afd::server

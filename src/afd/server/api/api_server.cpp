// The HTTP side of the ApiServer: routes, authentication, the shutdown gate and error bodies,
// over the event-driven front end (http_server.h).
#include "afd/server/api/api_server.h"

#include <chrono>
#include <ctime>
#include <thread>

#include "afd/common/error.h"
#include "afd/pd/kv_transport.h"
#include "afd/server/api/handlers.h"
#include "afd/server/api/http_server.h"
#include "afd/server/api/http_util.h"
#include "afd/server/api/kv_pulls.h"
#include "afd/server/api/server_context.h"

namespace afd::server {

void ApiServerOptions::Validate() const {
  AFD_CHECK(port >= 0 && port <= 65535, "api server: port {} is not in [0, 65535]", port);
  AFD_CHECK(!served_model_names.empty(), "api server: served_model_names is empty");
  for (const auto& name : served_model_names) {
    AFD_CHECK(!name.empty(), "api server: a served model name is empty");
  }
  AFD_CHECK(!defaults.max_tokens || *defaults.max_tokens >= 1,
            "api server: the default max_tokens {} is not positive", *defaults.max_tokens);
  AFD_CHECK(!defaults.temperature || (*defaults.temperature >= 0 && *defaults.temperature <= 1e6),
            "api server: the default temperature {} is not in [0, 1e6]", *defaults.temperature);
  AFD_CHECK(!defaults.top_p || (*defaults.top_p > 0 && *defaults.top_p <= 1),
            "api server: the default top_p {} is not in (0, 1]", *defaults.top_p);
  AFD_CHECK(!defaults.top_k || *defaults.top_k >= 0, "api server: the default top_k {} is negative",
            *defaults.top_k);
  AFD_CHECK(max_logprobs >= 0, "api server: max_logprobs {} is negative", max_logprobs);
  AFD_CHECK(max_waiting_requests >= 0, "api server: max_waiting_requests {} is negative",
            max_waiting_requests);
  AFD_CHECK(retry_after_s >= 0, "api server: retry_after_s {} is negative", retry_after_s);
  AFD_CHECK(num_io_threads >= 1, "api server: num_io_threads must be at least 1");
  AFD_CHECK(num_work_threads >= 1, "api server: num_work_threads must be at least 1");
  AFD_CHECK(header_timeout_s > 0 && body_timeout_s > 0 && write_timeout_s > 0,
            "api server: the header, body and write timeouts must be positive");
  AFD_CHECK(max_request_body_bytes >= 1024,
            "api server: max_request_body_bytes {} is below 1024 (--max-request-body-bytes)",
            max_request_body_bytes);
  AFD_CHECK(max_connections >= 1, "api server: max_connections must be at least 1");
  AFD_CHECK(shutdown_grace_ms >= 0, "api server: shutdown_grace_ms is negative");
}

// A KV consumer's pulls at once, and those that may wait for one (past it: 503).
constexpr int kKvPullThreads = 8;
constexpr size_t kMaxQueuedKvPulls = 4096;

using api::ApiError;
using api::HandlerResult;
using api::HttpRequest;
using api::HttpResponse;
using api::json;

struct ApiServer::Impl {
  std::shared_ptr<api::ServerContext> ctx;
  std::unique_ptr<api::HttpServer> http;
  std::unique_ptr<pd::KvTransferServer> kv_server;  // a KV producer's
  std::unique_ptr<WorkQueue> kv_pulls;              // a KV consumer's
  std::mutex stop_mu;
  bool started = false;
  bool stopped = false;

  HttpResponse Error(const ApiError& e) const {
    return api::ErrorResponse(e, ctx->options().retry_after_s);
  }

  // Runs one endpoint: ApiError -> its error body; any other exception -> 500. A pending
  // response (a generation) owns the in-flight count from then on.
  template <typename F>
  HandlerResult Serve(F&& handler) {
    ++ctx->in_flight;
    HandlerResult result;
    try {
      result = handler();
    } catch (const ApiError& e) {
      result = {Error(e), nullptr};
    } catch (const std::exception& e) {
      result = {Error(ApiError(500, std::string("internal error: ") + e.what())), nullptr};
    }
    if (!result.pending) --ctx->in_flight;
    return result;
  }

  // Shutdown and authentication gates, and the cheap endpoints: answered on the connection's
  // thread, so that /health and /metrics answer whatever the load.
  bool Inline(const HttpRequest& req, HandlerResult* out);
  // The endpoints that parse, tokenize and submit: on the worker pool.
  HandlerResult Work(const HttpRequest& req);
};

bool ApiServer::Impl::Inline(const HttpRequest& req, HandlerResult* out) {
  const api::ServerContext& c = *ctx;
  const bool open = req.path == "/health" || req.path == "/ping" || req.path == "/metrics";
  if (c.shutting_down && !open) {
    *out = {Error(ApiError(503, "the server is shutting down")), nullptr};
    return true;
  }
  const std::string& key = c.options().api_key;
  if (!key.empty() && req.path.rfind("/v1/", 0) == 0 &&
      req.Header("authorization") != "Bearer " + key) {
    *out = {Error(ApiError(401,
                           "Unauthorized: a valid 'Authorization: Bearer <api key>' header is "
                           "required")),
            nullptr};
    return true;
  }
  const bool get = req.method == "GET";
  // /ping: vLLM's alias of /health (GET or POST; load balancers' and SageMaker's probe).
  if ((req.path == "/health" && get) || (req.path == "/ping" && (get || req.method == "POST"))) {
    const std::string failure = ctx->engine().Failure();
    std::string why;
    if (!failure.empty()) {
      why = "the engines failed: " + failure;
    } else if (!ctx->engine().Ready()) {
      why = "the engines are not ready (not every process has joined)";
    } else if (ctx->shutting_down) {
      why = "the server is shutting down";
    }
    if (why.empty()) {
      out->response.status = 200;
      out->response.content_type = "text/plain";
    } else {
      out->response = Error(ApiError(503, why));
    }
    return true;
  }
  if (req.path == "/metrics" && get) {
    out->response.status = 200;
    out->response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    out->response.body = ctx->metrics().Render(ctx->engine().Load());
    return true;
  }
  if (req.path == "/version" && get) {
    out->response = api::JsonResponse(200, {{"version", AFD_VERSION}});
    return true;
  }
  if (req.path == "/v1/models" && get) {
    json data = json::array();
    const auto created = static_cast<int64_t>(std::time(nullptr));
    for (const auto& name : ctx->options().served_model_names) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "afd"},
                      {"root", ctx->model_name()},
                      {"parent", nullptr},
                      {"max_model_len", ctx->engine().model_info().max_model_len},
                      {"permission", json::array()}});
    }
    out->response = api::JsonResponse(200, {{"object", "list"}, {"data", std::move(data)}});
    return true;
  }
  const bool post_endpoint = req.path == "/v1/completions" || req.path == "/v1/chat/completions" ||
                             req.path == "/tokenize" || req.path == "/detokenize";
  if (post_endpoint && req.method == "POST") return false;  // the worker pool's
  const bool known = post_endpoint || req.path == "/health" || req.path == "/ping" ||
                     req.path == "/metrics" || req.path == "/version" || req.path == "/v1/models";
  if (known) {
    *out = {Error(ApiError(405, "Method Not Allowed: " + req.method + " " + req.path)), nullptr};
  } else {
    *out = {Error(ApiError(404, "Not Found: " + req.method + " " + req.path)), nullptr};
  }
  return true;
}

HandlerResult ApiServer::Impl::Work(const HttpRequest& req) {
  if (req.path == "/v1/completions") {
    return Serve([&] { return api::HandleCompletions(ctx, req); });
  }
  if (req.path == "/v1/chat/completions") {
    return Serve([&] { return api::HandleChatCompletions(ctx, req); });
  }
  if (req.path == "/tokenize") {
    return Serve([&] { return HandlerResult{api::HandleTokenize(*ctx, req), nullptr}; });
  }
  return Serve([&] { return HandlerResult{api::HandleDetokenize(*ctx, req), nullptr}; });
}

ApiServer::ApiServer(ApiServerOptions options, EngineClient& engine,
                     const text::Tokenizer* tokenizer, const text::ChatTemplate* chat_template)
    : impl_(std::make_unique<Impl>()) {
  options.Validate();
  api::HttpServerOptions h;
  h.host = options.host;
  h.port = options.port;
  h.io_threads = options.num_io_threads;
  h.work_threads = options.num_work_threads;
  h.header_timeout_s = options.header_timeout_s;
  h.body_timeout_s = options.body_timeout_s;
  h.write_timeout_s = options.write_timeout_s;
  h.max_body_bytes = options.max_request_body_bytes;
  h.max_connections = options.max_connections;
  impl_->ctx =
      std::make_shared<api::ServerContext>(std::move(options), engine, tokenizer, chat_template);
  const ApiServerOptions& o = impl_->ctx->options();
  if (o.kv_transfer && o.kv_transfer->consumes()) {
    // Decode legs pull their rows here, not on the endpoint workers (kv_pulls.h).
    impl_->kv_pulls = std::make_unique<WorkQueue>(kKvPullThreads, kMaxQueuedKvPulls);
    impl_->ctx->kv_pulls = impl_->kv_pulls.get();
  }
  api::HttpHandlers handlers;
  Impl* impl = impl_.get();
  handlers.inline_route = [impl](const HttpRequest& req, HandlerResult* out) {
    return impl->Inline(req, out);
  };
  handlers.work = [impl](const HttpRequest& req) { return impl->Work(req); };
  handlers.error = [impl](int status, const std::string& message) {
    return impl->Error(ApiError(status, message));
  };
  impl_->http = std::make_unique<api::HttpServer>(std::move(h), std::move(handlers));
}

ApiServer::~ApiServer() { Stop(); }

void ApiServer::Start() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  AFD_CHECK(!impl_->started, "api server: Start called twice");
  const ApiServerOptions& o = impl_->ctx->options();
  if (o.kv_transfer && o.kv_transfer->produces()) {
    EngineClient& engine = impl_->ctx->engine();
    AFD_CHECK(engine.SupportsKvTransfer(),
              "--kv-transfer-config: kv_role {} needs engines that hold KV rows for transfer; "
              "this server's do not",
              o.kv_transfer->role == KvTransferConfig::Role::kBoth ? "kv_both" : "kv_producer");
    const double timeout = o.kv_transfer->transfer_timeout_s;
    impl_->kv_server = std::make_unique<pd::KvTransferServer>(
        o.kv_transfer->kv_ip, o.kv_transfer->kv_port, o.kv_secret, engine.kv_cache_layout().model,
        [&engine, timeout](uint64_t id, bool device_ok) {
          return engine.ExportHeldKv(id, timeout, device_ok);
        },
        [&engine](uint64_t id) { engine.ReleaseHeldKv(id); }, timeout);
    impl_->ctx->kv_port = impl_->kv_server->port();
  }
  impl_->http->Start();
  impl_->started = true;
}

int ApiServer::kv_port() const { return impl_->kv_server ? impl_->kv_server->port() : 0; }

int ApiServer::port() const { return impl_->http->port(); }

void ApiServer::BeginShutdown() { impl_->ctx->shutting_down = true; }

int64_t ApiServer::num_in_flight() const { return impl_->ctx->in_flight; }

void ApiServer::Stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  BeginShutdown();
  // Aborted sequences end their requests with an error; give them time to send it. Aborting
  // again on each round catches sequences submitted while the first round ran.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(impl_->ctx->options().shutdown_grace_ms);
  do {
    impl_->ctx->AbortAll();
    if (impl_->ctx->in_flight == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  impl_->http->Stop();
  if (impl_->kv_pulls) impl_->kv_pulls->Stop();  // a pull under way ends within its timeout
  impl_->kv_server.reset();
}

}  // namespace afd::server

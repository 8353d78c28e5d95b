// The HTTP side of the ApiServer: routes, authentication, the shutdown gate and error bodies.
#include "afd/server/api/api_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>
#include <thread>

#include "afd/common/error.h"
#include "afd/server/api/handlers.h"
#include "afd/server/api/http_util.h"
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
  AFD_CHECK(num_http_threads >= 1, "api server: num_http_threads must be at least 1");
  AFD_CHECK(shutdown_grace_ms >= 0, "api server: shutdown_grace_ms is negative");
}

using api::ApiError;
using api::json;

namespace {
// Connections waiting to be accepted (the kernel caps it at net.core.somaxconn); uvicorn, which
// serves vLLM, uses 2048.
constexpr int kListenBacklog = 2048;
}  // namespace

struct ApiServer::Impl {
  std::shared_ptr<api::ServerContext> ctx;
  httplib::Server http;
  std::thread listener;
  int port = 0;
  int listen_fd = -1;  // the listening socket, captured when cpp-httplib creates it
  std::mutex stop_mu;
  bool started = false;
  bool stopped = false;

  // Runs one endpoint: ApiError -> its error body; any other exception -> 500. `handler`
  // returns true when it handed the response to a stream (which then ends the in-flight count).
  template <typename F>
  void Serve(httplib::Response& res, F&& handler) {
    ++ctx->in_flight;
    bool streaming = false;
    try {
      streaming = handler();
    } catch (const ApiError& e) {
      api::SendError(res, e);
      if (e.status() == 503) {
        res.set_header("Retry-After", std::to_string(ctx->options().retry_after_s));
      }
    } catch (const std::exception& e) {
      api::SendError(res, ApiError(500, std::string("internal error: ") + e.what()));
    }
    if (!streaming) --ctx->in_flight;
  }

  void Routes();
};

void ApiServer::Impl::Routes() {
  const std::shared_ptr<api::ServerContext> c = ctx;
  http.set_pre_routing_handler([c](const httplib::Request& req, httplib::Response& res) {
    const bool open = req.path == "/health" || req.path == "/metrics";
    if (c->shutting_down && !open) {
      api::SendError(res, ApiError(503, "the server is shutting down"));
      res.set_header("Retry-After", std::to_string(c->options().retry_after_s));
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string& key = c->options().api_key;
    if (!key.empty() && req.path.rfind("/v1/", 0) == 0 &&
        req.get_header_value("Authorization") != "Bearer " + key) {
      api::SendError(res, ApiError(401,
                                   "Unauthorized: a valid 'Authorization: Bearer <api key>' "
                                   "header is required"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Serve(res, [&] { return api::HandleCompletions(ctx, req, res); });
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Serve(res, [&] { return api::HandleChatCompletions(ctx, req, res); });
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Serve(res, [&] {
      api::HandleTokenize(*ctx, req, res);
      return false;
    });
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Serve(res, [&] {
      api::HandleDetokenize(*ctx, req, res);
      return false;
    });
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
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
    api::SendJson(res, 200, {{"object", "list"}, {"data", std::move(data)}});
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
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
      res.status = 200;
    } else {
      api::SendError(res, ApiError(503, why));
    }
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(ctx->metrics().Render(ctx->engine().Load()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    api::SendJson(res, 200, {{"version", AFD_VERSION}});
  });
  // Unknown paths and methods: the error body rather than httplib's empty one.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string message = res.status == 404 ? "Not Found: " + req.method + " " + req.path
                                                  : "HTTP " + std::to_string(res.status);
    api::SendJson(res, res.status, api::ErrorBody(res.status, message));
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        api::SendError(res, ApiError(500, "internal error: " + what));
      });
}

ApiServer::ApiServer(ApiServerOptions options, EngineClient& engine, const Tokenizer* tokenizer,
                     const ChatTemplate* chat_template)
    : impl_(std::make_unique<Impl>()) {
  options.Validate();
  const int threads = options.num_http_threads;
  impl_->ctx =
      std::make_shared<api::ServerContext>(std::move(options), engine, tokenizer, chat_template);
  impl_->http.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, under which a second server
  // binds a port already in use (and the kernel splits the connections between the two), and
  // two port-0 binds can be handed the same port.
  impl_->http.set_socket_options([impl = impl_.get()](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    impl->listen_fd = sock;
  });
  impl_->Routes();
}

ApiServer::~ApiServer() { Stop(); }

void ApiServer::Start() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  AFD_CHECK(!impl_->started, "api server: Start called twice");
  const ApiServerOptions& o = impl_->ctx->options();
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    AFD_CHECK(port > 0, "api server: cannot bind {}:0 (an ephemeral port)", o.host);
  } else {
    AFD_CHECK(impl_->http.bind_to_port(o.host, port),
              "api server: cannot bind {}:{} (address in use, or not an address of this host)",
              o.host, port);
  }
  // cpp-httplib (the shared library) listens with a backlog of 5: a burst of connections beyond
  // it is reset by the kernel instead of waiting for a thread. Listening again raises it.
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, kListenBacklog);
  impl_->port = port;
  impl_->started = true;
  impl_->listener = std::thread([this] { impl_->http.listen_after_bind(); });
}

int ApiServer::port() const { return impl_->port; }

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
  if (impl_->started) {
    impl_->http.stop();
    impl_->listener.join();
  }
}

}  // namespace afd::server

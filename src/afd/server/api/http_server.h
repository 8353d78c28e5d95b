// The event-driven HTTP/1.1 front end of the OpenAI server (Boost.Beast over Boost.Asio): a few
// I/O threads serve every connection; no thread is held by an open request, streamed or not.
// Endpoint handlers that parse, tokenize and submit run on a small worker pool; responses still
// being produced (PendingResponse) are pumped on their connection's strand as engine output
// arrives.
//
// Every wait a client controls is bounded (docs/reliability.md):
//   - a request's headers must arrive whole within header_timeout_s of the connection opening
//     or of the previous response's end (slowloris, idle keep-alive sockets: closed; a request
//     cut off mid-header: 408);
//   - its body within body_timeout_s of the headers (a lying Content-Length: 408 naming the
//     bytes that came); headers past max_header_bytes: 431; a body past max_body_bytes: 413
//     (from the Content-Length, before it is read);
//   - each write of a response within write_timeout_s (a client that stops reading is gone);
//   - at most max_connections open connections: past it a connection gets 503 and is closed.
// Keep-alive and pipelining: requests on one connection are answered in order, one at a time. A
// client that closes (or half-closes) its connection while its request is answered is gone,
// as under uvicorn (vLLM's server): its request is aborted (PendingResponse::ClientGone).
//
// Thread safety: Start once; port, num_connections and Stop from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "afd/server/api/http_types.h"

namespace afd::server::api {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: an ephemeral port
  int io_threads = 2;
  int work_threads = 4;  // endpoint handlers (JSON parsing, tokenization, submission)
  double header_timeout_s = 10;
  double body_timeout_s = 60;
  double write_timeout_s = 60;
  int64_t max_header_bytes = 16 * 1024;
  int64_t max_body_bytes = 8 * 1024 * 1024;
  int64_t max_connections = 16384;
  int pump_tick_ms = 100;  // how often an unwoken PendingResponse is pumped anyway
  // Throws afd::Error naming the bad field.
  void Validate() const;
};

struct HttpHandlers {
  // Answers on the connection's strand when it returns true (cheap endpoints: /health,
  // /metrics, gates); else `work` answers on the worker pool.
  std::function<bool(const HttpRequest&, HandlerResult*)> inline_route;
  std::function<HandlerResult(const HttpRequest&)> work;
  // The body of an error the transport answers itself (413, 431, 408, 400, 503).
  std::function<HttpResponse(int status, const std::string& message)> error;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandlers handlers);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (throws afd::Error naming it when it cannot) and starts the threads.
  void Start();
  int port() const;
  int64_t num_connections() const;
  // Closes the listener and every connection, joins the threads. Idempotent.
  void Stop();

 private:
  friend class Session;  // a connection (http_server.cpp)
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace afd::server::api

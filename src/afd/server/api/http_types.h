// The HTTP request and response as the OpenAI endpoints see them, apart from the transport
// (http_server.h, Boost.Beast): a request read whole, and a response that is either ready at
// once or still being produced (a generation: streamed as server-sent events, or answered once
// every choice is done) without holding a thread while it waits.
//
// Thread safety: HttpRequest / HttpResponse are values. A PendingResponse is driven by one
// connection: SetWaker, Pump and ClientGone are called on that connection's strand, one at a
// time; the waker may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace afd::server::api {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  // The first value of header `name` (any case), or "".
  std::string Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones (Retry-After, ...)
};

// A response still being produced. The server calls Pump on the connection's strand when the
// waker has been called (new engine output) and on a periodic tick (deadlines, engine failure).
class PendingResponse {
 public:
  virtual ~PendingResponse() = default;
  // True: a 200 text/event-stream whose bytes Pump hands out as they come; false: one whole
  // response, handed out once ready.
  virtual bool streamed() const = 0;
  // Before the first Pump: `wake` asks the server for a Pump soon (cheap, any thread).
  virtual void SetWaker(std::function<void()> wake) = 0;
  // Streamed: appends the bytes to send now to *out; returns true when the stream is over.
  // Whole: returns true once *response is set.
  virtual bool Pump(std::string* out, HttpResponse* response) = 0;
  // The client left (its connection closed, or a write failed or timed out) before the end.
  virtual void ClientGone() = 0;
};

// What an endpoint answers: `response`, or (when `pending` is set) a response to come.
struct HandlerResult {
  HttpResponse response;
  std::shared_ptr<PendingResponse> pending;
};

}  // namespace afd::server::api

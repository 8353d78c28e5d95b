// A small HTTP client for OpenAI-compatible servers: POST a JSON body and receive a
// text/event-stream response event by event (streamed completions), or GET a path. Every call
// is bounded by a timeout; failures come back as values (a benchmark counts them), never throws.
// Thread safety: const methods may be called from any number of threads at once (each call
// opens its own connection).
#pragma once

#include <functional>
#include <string>

namespace afd::bench_client {

// "http://host:port/prefix" split for the HTTP library. Throws afd::Error naming the URL when it
// is not http(s)://host[:port][/path].
struct BaseUrl {
  std::string scheme_host_port;  // "http://127.0.0.1:8000"
  std::string path_prefix;       // "" or "/prefix" (no trailing "/")
};
BaseUrl ParseBaseUrl(const std::string& url);

struct HttpReply {
  int status = 0;               // HTTP status; 0 when no response arrived
  std::string transport_error;  // why no (complete) response arrived, else empty
  std::string body;             // the body of a non-200 reply (for error messages)
};

class HttpStreamClient {
 public:
  // Called with the data of each SSE event of a 200 reply, as it arrives; return false to stop
  // reading (the connection is closed).
  using EventHandler = std::function<bool(const std::string& data)>;

  // `timeout_s` bounds connecting, each read and write, and (checked per received piece) the
  // whole call. `api_key` non-empty: sent as "Authorization: Bearer <key>".
  HttpStreamClient(const std::string& base_url, double timeout_s, std::string api_key);

  const std::string& base_url() const { return url_text_; }

  // POSTs `json_body` to prefix + `path` (Accept: text/event-stream). A 200 reply's events go to
  // `on_event`; any other reply's body is returned in `body`.
  HttpReply PostStream(const std::string& path, const std::string& json_body,
                       const EventHandler& on_event) const;
  // GETs prefix + `path`; the body comes back whatever the status.
  HttpReply Get(const std::string& path) const;

 private:
  std::string url_text_;
  BaseUrl url_;
  double timeout_s_;
  std::string api_key_;
};

}  // namespace afd::bench_client

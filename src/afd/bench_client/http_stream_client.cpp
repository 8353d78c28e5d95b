#include "afd/bench_client/http_stream_client.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "afd/bench_client/sse_parser.h"
#include "afd/common/deadline.h"
#include "afd/common/error.h"

namespace afd::bench_client {

BaseUrl ParseBaseUrl(const std::string& url) {
  const size_t sep = url.find("://");
  AFD_CHECK(sep != std::string::npos, "--base-url \"{}\": expected http://host[:port][/path]", url);
  const std::string scheme = url.substr(0, sep);
  AFD_CHECK(scheme == "http" || scheme == "https",
            "--base-url \"{}\": scheme \"{}\" is not http or https", url, scheme);
  const size_t slash = url.find('/', sep + 3);
  const std::string authority =
      url.substr(sep + 3, slash == std::string::npos ? std::string::npos : slash - sep - 3);
  AFD_CHECK(!authority.empty() && authority.find_first_of(" ?#@") == std::string::npos,
            "--base-url \"{}\": no valid host", url);
  const size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']') == std::string::npos) {
    const std::string port = authority.substr(colon + 1);
    AFD_CHECK(!port.empty() && port.size() <= 5 &&
                  port.find_first_not_of("0123456789") == std::string::npos &&
                  std::stoi(port) >= 1 && std::stoi(port) <= 65535,
              "--base-url \"{}\": port \"{}\" is not a number in 1..65535", url, port);
  }
  BaseUrl out;
  out.scheme_host_port = scheme + "://" + authority;
  if (slash != std::string::npos) out.path_prefix = url.substr(slash);
  while (!out.path_prefix.empty() && out.path_prefix.back() == '/') out.path_prefix.pop_back();
  return out;
}

namespace {

std::unique_ptr<httplib::Client> MakeClient(const BaseUrl& url, double timeout_s,
                                            const std::string& api_key) {
  auto client = std::make_unique<httplib::Client>(url.scheme_host_port);
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::duration<double>(timeout_s));
  const auto connect = std::min(timeout, std::chrono::microseconds(30'000'000));
  client->set_connection_timeout(connect.count() / 1'000'000, connect.count() % 1'000'000);
  client->set_read_timeout(timeout);
  client->set_write_timeout(timeout);
  client->set_keep_alive(false);
  if (!api_key.empty()) client->set_bearer_token_auth(api_key);
  return client;
}

std::string TransportError(httplib::Error error, const std::string& url) {
  switch (error) {
    case httplib::Error::Connection:
      return fmt::format("cannot connect to {} (connection refused or host unreachable)", url);
    case httplib::Error::ConnectionTimeout:
      return fmt::format("connecting to {} timed out", url);
    case httplib::Error::Read:
      return fmt::format("reading the reply from {} failed or timed out", url);
    case httplib::Error::Write:
      return fmt::format("sending the request to {} failed or timed out", url);
    default:
      return fmt::format("request to {} failed: {}", url, httplib::to_string(error));
  }
}

}  // namespace

HttpStreamClient::HttpStreamClient(const std::string& base_url, double timeout_s,
                                   std::string api_key)
    : url_text_(base_url),
      url_(ParseBaseUrl(base_url)),
      timeout_s_(timeout_s),
      api_key_(std::move(api_key)) {
  AFD_CHECK(std::isfinite(timeout_s) && timeout_s > 0,
            "--request-timeout-s {}: must be a positive number of seconds", timeout_s);
}

HttpReply HttpStreamClient::PostStream(const std::string& path, const std::string& json_body,
                                       const EventHandler& on_event) const {
  const auto client = MakeClient(url_, timeout_s_, api_key_);
  const std::string url = url_.scheme_host_port + url_.path_prefix + path;
  const Deadline deadline = Deadline::In(timeout_s_);
  HttpReply reply;
  SseParser parser;
  bool stopped = false;  // on_event asked to stop: not an error
  bool timed_out = false;
  httplib::Request req;
  req.method = "POST";
  req.path = url_.path_prefix + path;
  req.headers = {{"Accept", "text/event-stream"}};
  req.body = json_body;
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& res) {
    reply.status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (reply.status != 200) {
      reply.body.append(data, n);
      return true;
    }
    for (const std::string& event : parser.Feed(std::string_view(data, n))) {
      if (!on_event(event)) {
        stopped = true;
        return false;
      }
    }
    if (deadline.expired()) {
      timed_out = true;
      return false;
    }
    return true;
  };
  const httplib::Result result = client->send(req);
  if (timed_out) {
    reply.transport_error =
        fmt::format("request to {} timed out after {} s (--request-timeout-s)", url, timeout_s_);
  } else if (!result && !stopped) {
    reply.transport_error = TransportError(result.error(), url);
  } else if (reply.status == 200 && !stopped) {
    for (const std::string& event : parser.Finish()) {
      if (!on_event(event)) break;
    }
  }
  return reply;
}

HttpReply HttpStreamClient::Get(const std::string& path) const {
  const auto client = MakeClient(url_, timeout_s_, api_key_);
  HttpReply reply;
  const httplib::Result result = client->Get(url_.path_prefix + path);
  if (!result) {
    reply.transport_error =
        TransportError(result.error(), url_.scheme_host_port + url_.path_prefix + path);
    return reply;
  }
  reply.status = result->status;
  reply.body = result->body;
  return reply;
}

}  // namespace afd::bench_client

// Helpers of the ApiServer tests: a server on an ephemeral port over a FakeEngine, JSON POSTs,
// and SSE parsing.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afd/server/api/api_server.h"
#include "afd/text/chat_template/chat_template.h"
#include "afd/text/tokenizer/tokenizer.h"
#include "server/fake_engine.h"

namespace afd::server::test {

using json = nlohmann::ordered_json;

struct HttpResult {
  int status = 0;
  json body;  // parsed when the body is JSON, else null
  std::string raw;
  httplib::Headers headers;
};

class ApiHarness {
 public:
  ApiHarness(EngineModelInfo info, ApiServerOptions options = {},
             const text::Tokenizer* tokenizer = nullptr,
             const text::ChatTemplate* chat_template = nullptr,
             std::chrono::microseconds step = std::chrono::microseconds(300))
      : engine(std::move(info), step) {
    options.host = "127.0.0.1";
    options.port = 0;
    server = std::make_unique<ApiServer>(options, engine, tokenizer, chat_template);
    server->Start();
  }
  ~ApiHarness() { server->Stop(); }

  std::unique_ptr<httplib::Client> Client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    c->set_read_timeout(30, 0);
    return c;
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }

  HttpResult Post(const std::string& path, const std::string& body,
                  const httplib::Headers& headers = {}) const {
    auto r = Client()->Post(path.c_str(), headers, body, "application/json");
    return Result(r);
  }
  HttpResult Post(const std::string& path, const json& body,
                  const httplib::Headers& headers = {}) const {
    return Post(path, body.dump(), headers);
  }
  HttpResult Get(const std::string& path, const httplib::Headers& headers = {}) const {
    return Result(Client()->Get(path.c_str(), headers));
  }

  static HttpResult Result(const httplib::Result& r) {
    HttpResult out;
    if (!r) return out;
    out.status = r->status;
    out.raw = r->body;
    out.headers = r->headers;
    out.body = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (out.body.is_discarded()) out.body = nullptr;
    return out;
  }

  FakeEngine engine;
  std::unique_ptr<ApiServer> server;
};

// The "data: ..." payloads of an SSE body, in order.
inline std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

inline EngineModelInfo SmallModel() {
  EngineModelInfo info;
  info.vocab_size = 1000;
  info.max_model_len = 256;
  info.eos_token_ids = {999};
  return info;
}

}  // namespace afd::server::test

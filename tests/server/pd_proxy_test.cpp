// `afd proxy` (server/pd_proxy.h) in front of two KV producers and a KV consumer: streamed and
// whole answers equal a colocated server's; a prefiller that is down, or is not a producer,
// gives the client an error naming it, within the timeout; instances that are down are passed
// over; the proxy's own routes.
#include "afd/server/pd_proxy.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <thread>

#include "afd/comm/socket.h"
#include "server/kv_instance.h"

namespace afd::server::test {
namespace {

struct Proxied {
  std::unique_ptr<PdProxy> proxy;
  // timeout_s: the proxy's bound on each leg (short: the failure tests wait for it).
  Proxied(std::vector<PdProxyOptions::Instance> prefillers,
          std::vector<PdProxyOptions::Instance> decoders, double timeout_s = 3) {
    PdProxyOptions o;
    o.port = 0;
    o.prefillers = std::move(prefillers);
    o.decoders = std::move(decoders);
    o.timeout_s = timeout_s;
    proxy = std::make_unique<PdProxy>(o);
    proxy->Start();
  }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", proxy->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  std::pair<int, json> Post(const std::string& path, const json& body) const {
    auto r = Client().Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, nullptr};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
};

PdProxyOptions::Instance At(const KvInstance& s) { return {"127.0.0.1", s.server->port()}; }

// The token ids of a streamed completion's events.
std::vector<int32_t> StreamedIds(const std::string& sse) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string data = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    const json chunk = json::parse(data);
    for (const auto& id : chunk["choices"][0]["token_ids"]) ids.push_back(id);
  }
  return ids;
}

TEST(PdProxy, AnswersAsAColocatedServerDoes) {
  KvInstance colocated(std::nullopt), p1(KvTransferConfig::Role::kProducer),
      p2(KvTransferConfig::Role::kProducer), decoder(KvTransferConfig::Role::kConsumer);
  Proxied proxy({At(p1), At(p2)}, {At(decoder)});
  for (int len : {3, 90}) {
    const json req = Request(Prompt(len), 10);
    const auto [ref_status, ref] = colocated.Post("/v1/completions", req);
    ASSERT_EQ(ref_status, 200);
    for (int round = 0; round < 2; ++round) {  // both prefillers, in turn
      const auto [status, got] = proxy.Post("/v1/completions", req);
      ASSERT_EQ(status, 200) << got.dump();
      EXPECT_EQ(got["choices"][0]["token_ids"], ref["choices"][0]["token_ids"]);
      EXPECT_EQ(got["choices"][0]["logprobs"], ref["choices"][0]["logprobs"]);
    }
    json streamed = req;
    streamed["stream"] = true;
    auto r = proxy.Client().Post("/v1/completions", streamed.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos) << r->body;
    EXPECT_EQ(json(StreamedIds(r->body)), ref["choices"][0]["token_ids"]);
  }
  for (int i = 0;
       i < 200 && (p1.engine->Load().total.kv_held > 0 || p2.engine->Load().total.kv_held > 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(p1.engine->Load().total.kv_held + p2.engine->Load().total.kv_held, 0);
}

// 50 prompts of 1 to 2,000 tokens, streamed and not, each equal to the colocated answer.
TEST(PdProxy, FiftyPromptsOfOneToTwoThousandTokens) {
  KvInstance colocated(std::nullopt), p1(KvTransferConfig::Role::kProducer),
      p2(KvTransferConfig::Role::kProducer), decoder(KvTransferConfig::Role::kConsumer);
  // A 2,000-token prefill on a loaded 2-core machine may take more than the failure tests' 3 s.
  Proxied proxy({At(p1), At(p2)}, {At(decoder)}, 60);
  for (int i = 0; i < 50; ++i) {
    const int len = 1 + (i * 1999) / 49;  // 1 .. 2000
    const json req = Request(Prompt(len), 4);
    const auto [ref_status, ref] = colocated.Post("/v1/completions", req);
    ASSERT_EQ(ref_status, 200) << len;
    if (i % 2 == 0) {
      const auto [status, got] = proxy.Post("/v1/completions", req);
      ASSERT_EQ(status, 200) << len << " " << got.dump();
      EXPECT_EQ(got["choices"][0]["token_ids"], ref["choices"][0]["token_ids"]) << len;
      EXPECT_EQ(got["choices"][0]["logprobs"], ref["choices"][0]["logprobs"]) << len;
    } else {
      json streamed = req;
      streamed["stream"] = true;
      auto r = proxy.Client().Post("/v1/completions", streamed.dump(), "application/json");
      ASSERT_TRUE(r) << len;
      ASSERT_EQ(r->status, 200) << len << " " << r->body;
      EXPECT_EQ(json(StreamedIds(r->body)), ref["choices"][0]["token_ids"]) << len;
    }
  }
}

TEST(PdProxy, FailingInstancesAreNamedNotWaitedForEver) {
  KvInstance plain(std::nullopt), decoder(KvTransferConfig::Role::kConsumer);
  afd::comm::Socket taken = afd::comm::Listen("127.0.0.1", 0);
  const int down = afd::comm::LocalPort(taken);
  taken.Close();
  {
    Proxied proxy({{"127.0.0.1", down}}, {At(decoder)});
    const auto start = std::chrono::steady_clock::now();
    const auto [status, r] = proxy.Post("/v1/completions", Request(Prompt(5), 4));
    EXPECT_EQ(status, 502) << r.dump();
    EXPECT_NE(r.dump().find("127.0.0.1:" + std::to_string(down)), std::string::npos) << r.dump();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
  }
  {
    // A decoder that is not a KV consumer refuses a streamed decode leg: its 400, whole.
    KvInstance producer(KvTransferConfig::Role::kProducer);
    Proxied proxy({At(producer)}, {At(plain)});
    json streamed = Request(Prompt(5), 4);
    streamed["stream"] = true;
    auto r = proxy.Client().Post("/v1/completions", streamed.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("not a KV consumer"), std::string::npos) << r->body;
  }
  {
    Proxied proxy({At(plain)}, {At(decoder)});  // not a KV producer: its 400 comes through
    const auto [status, r] = proxy.Post("/v1/completions", Request(Prompt(5), 4));
    EXPECT_EQ(status, 400) << r.dump();
    EXPECT_NE(r.dump().find("not a KV producer"), std::string::npos) << r.dump();
  }
}

// A prefiller or decoder that is down (refuses connections) is passed over: every request is
// answered by the live ones, as a colocated server answers it.
TEST(PdProxy, InstancesThatAreDownArePassedOver) {
  KvInstance colocated(std::nullopt), producer(KvTransferConfig::Role::kProducer),
      decoder(KvTransferConfig::Role::kConsumer);
  std::vector<int> down;
  for (int i = 0; i < 2; ++i) {
    afd::comm::Socket taken = afd::comm::Listen("127.0.0.1", 0);
    down.push_back(afd::comm::LocalPort(taken));
  }  // closed: nothing listens there now
  Proxied proxy({{"127.0.0.1", down[0]}, At(producer)}, {{"127.0.0.1", down[1]}, At(decoder)});
  for (int i = 0; i < 4; ++i) {  // both round-robin positions of each list
    const json body = Request(Prompt(7 + i), 4);
    const auto [want_status, want] = colocated.Post("/v1/completions", body);
    ASSERT_EQ(want_status, 200);
    const auto [status, got] = proxy.Post("/v1/completions", body);
    ASSERT_EQ(status, 200) << got.dump();
    EXPECT_EQ(got["choices"][0]["token_ids"], want["choices"][0]["token_ids"]) << i;
  }
}

TEST(PdProxy, OwnRoutes) {
  Proxied proxy({{"127.0.0.1", 1}}, {{"127.0.0.1", 2}});
  auto c = proxy.Client();
  auto h = c.Get("/healthcheck");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto bad = c.Post("/v1/completions", "[1]", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto get = c.Get("/v1/completions");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  auto nowhere = c.Get("/v2/models");
  ASSERT_TRUE(nowhere);
  EXPECT_EQ(nowhere->status, 404);
  auto no_decoder = c.Get("/v1/models");  // nothing listens on port 2
  ASSERT_TRUE(no_decoder);
  EXPECT_EQ(no_decoder->status, 502);
}

// A decode leg that no decoder takes (the only one is down) frees the prefiller's held rows at
// once, not after its hold timeout (480 s).
TEST(PdProxy, AnUntakenDecodeLegFreesThePrefillersRows) {
  KvInstance producer(KvTransferConfig::Role::kProducer);
  int down = 0;
  {
    afd::comm::Socket taken = afd::comm::Listen("127.0.0.1", 0);
    down = afd::comm::LocalPort(taken);
  }
  PdProxyOptions o;
  o.port = 0;
  o.prefillers = {At(producer)};
  o.decoders = {{"127.0.0.1", down}};
  o.timeout_s = 3;
  o.kv_secret = kSecret;  // the producer's (KvInstance's)
  PdProxy proxy(o);
  proxy.Start();
  for (bool stream : {false, true}) {
    json body = Request(Prompt(30), 4);
    body["stream"] = stream;
    httplib::Client c("127.0.0.1", proxy.port());
    c.set_read_timeout(30, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    bool freed = false;
    for (int i = 0; i < 500 && !freed; ++i) {
      freed = producer.engine->Load().total.kv_held == 0;
      if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(freed) << (stream ? "streamed" : "whole");
  }
  proxy.Stop();
}

// GET /v1/models is the decoders' list (what `afd bench serve` and OpenAI clients ask first).
TEST(PdProxy, ListsTheDecodersModels) {
  KvInstance producer(KvTransferConfig::Role::kProducer),
      decoder(KvTransferConfig::Role::kConsumer);
  Proxied proxy({At(producer)}, {At(decoder)});
  auto r = proxy.Client().Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  httplib::Client direct("127.0.0.1", decoder.server->port());
  auto want = direct.Get("/v1/models");
  ASSERT_TRUE(want);
  EXPECT_EQ(json::parse(r->body)["data"][0]["id"], json::parse(want->body)["data"][0]["id"]);
}

}  // namespace
}  // namespace afd::server::test

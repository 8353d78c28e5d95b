// Prefill/decode disaggregation through the OpenAI API (docs/pd.md), as vLLM's proxy drives it:
// the prefill leg (max_tokens 1, kv_transfer_params.do_remote_decode) on a producer server
// returns kv_transfer_params; the decode leg with them on a consumer server pulls the rows over
// the KV port and answers what a colocated server answers. Bad parameters are 400s naming the
// field; a pull that fails is a 502 for that request, and the consumer goes on serving.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "afd/comm/socket.h"
#include "server/kv_instance.h"

namespace afd::server::test {
namespace {

TEST(KvTransferApi, ProxyFlowGivesTheColocatedAnswer) {
  KvInstance colocated(std::nullopt), producer(KvTransferConfig::Role::kProducer),
      consumer(KvTransferConfig::Role::kConsumer);
  for (int len : {5, 70, 150}) {
    const json req = Request(Prompt(len), 12);
    const auto [ref_status, ref] = colocated.Post("/v1/completions", req);
    ASSERT_EQ(ref_status, 200) << ref.dump();
    // Prefill leg.
    json prefill = req;
    prefill["max_tokens"] = 1;
    prefill["kv_transfer_params"] = {{"do_remote_decode", true},
                                     {"do_remote_prefill", false},
                                     {"remote_engine_id", nullptr},
                                     {"remote_host", nullptr}};
    const auto [p_status, p] = producer.Post("/v1/completions", prefill);
    ASSERT_EQ(p_status, 200) << p.dump();
    const json& params = p["kv_transfer_params"];
    ASSERT_TRUE(params.is_object()) << p.dump();
    EXPECT_EQ(params["do_remote_prefill"], true);
    EXPECT_EQ(params["remote_port"], producer.server->kv_port());
    EXPECT_EQ(params["num_positions"], len);
    EXPECT_EQ(params["tp_size"], 1);
    EXPECT_FALSE(params["remote_block_ids"].empty());
    EXPECT_EQ(p["choices"][0]["token_ids"][0], ref["choices"][0]["token_ids"][0]);
    // Decode leg.
    json decode = req;
    decode["kv_transfer_params"] = params;
    const auto [d_status, d] = consumer.Post("/v1/completions", decode);
    ASSERT_EQ(d_status, 200) << d.dump();
    EXPECT_EQ(d["choices"][0]["token_ids"], ref["choices"][0]["token_ids"]) << "prompt " << len;
    EXPECT_EQ(d["choices"][0]["logprobs"], ref["choices"][0]["logprobs"]) << "prompt " << len;
    EXPECT_EQ(d["choices"][0]["text"], ref["choices"][0]["text"]);
    // The rows were pulled once: pulling them again fails (502), naming the request.
    const auto [again_status, again] = consumer.Post("/v1/completions", decode);
    EXPECT_EQ(again_status, 502) << again.dump();
    EXPECT_NE(again.dump().find("holds no KV rows"), std::string::npos) << again.dump();
    EXPECT_EQ(again["error"]["param"], "kv_transfer_params");
  }
  // Every held row was released on the producer.
  for (int i = 0; i < 200 && producer.engine->Load().total.kv_held > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(producer.engine->Load().total.kv_held, 0);
  // The consumer still serves plain requests.
  EXPECT_EQ(consumer.Post("/v1/completions", Request(Prompt(4), 3)).first, 200);
  // Its metrics count the three pulls (5 + 70 + 150 positions of every layer's rows) and the
  // three that failed.
  httplib::Client c("127.0.0.1", consumer.server->port());
  const auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const runtime::KvLayout layout = consumer.engine->kv_cache_layout();
  const int64_t row_bytes =
      layout.num_layers * layout.row_width * static_cast<int64_t>(DTypeSize(layout.dtype));
  auto value = [&](const std::string& series) {
    const size_t at = m->body.find("\n" + series + "{");
    if (at == std::string::npos) return -1.0;
    const size_t end = m->body.find('\n', at + 1);
    return std::stod(m->body.substr(m->body.rfind(' ', end) + 1, end));
  };
  EXPECT_EQ(value("afd:kv_transfer_positions_total"), 225) << m->body;
  EXPECT_EQ(value("afd:kv_transfer_bytes_total"), 225.0 * row_bytes) << m->body;
  EXPECT_EQ(value("afd:kv_transfer_seconds_count"), 3) << m->body;
  EXPECT_EQ(value("afd:kv_transfer_failures_total"), 3) << m->body;
}

TEST(KvTransferApi, BadParametersAre400sNamingTheField) {
  KvInstance producer(KvTransferConfig::Role::kProducer),
      consumer(KvTransferConfig::Role::kConsumer), plain(std::nullopt);
  auto error_param = [](const KvInstance& s, json body) {
    const auto [status, r] = s.Post("/v1/completions", body);
    EXPECT_EQ(status, 400) << r.dump();
    return r["error"]["param"].is_string() ? r["error"]["param"].get<std::string>() : "";
  };
  json req = Request(Prompt(8), 1);
  req["kv_transfer_params"] = {{"do_remote_decode", true}};
  EXPECT_EQ(error_param(plain, req), "kv_transfer_params.do_remote_decode");  // not a producer
  EXPECT_EQ(error_param(consumer, req), "kv_transfer_params.do_remote_decode");
  json streamed = req;
  streamed["stream"] = true;
  EXPECT_EQ(error_param(producer, streamed), "kv_transfer_params.do_remote_decode");
  json two = req;
  two["n"] = 2;
  EXPECT_EQ(error_param(producer, two), "kv_transfer_params");
  // The prompt's log-probabilities: refused on the prefill leg already (the decode leg would
  // refuse them after the prefill ran), and on the decode leg before any pull.
  json echoed = req;
  echoed["echo"] = true;
  EXPECT_EQ(error_param(producer, echoed), "echo");
  json echoed_decode = Request(Prompt(8), 4);
  echoed_decode["echo"] = true;
  echoed_decode["kv_transfer_params"] = {{"do_remote_prefill", true},
                                         {"remote_host", "127.0.0.1"},
                                         {"remote_port", 1},
                                         {"remote_request_id", 1}};
  EXPECT_EQ(error_param(consumer, echoed_decode), "echo");
  echoed.erase("logprobs");  // echo alone (the prompt's text) is served
  EXPECT_EQ(producer.Post("/v1/completions", echoed).first, 200);
  json decode = Request(Prompt(8), 4);
  decode["kv_transfer_params"] = {{"do_remote_prefill", true},
                                  {"remote_host", "127.0.0.1"},
                                  {"remote_port", 70000},
                                  {"remote_request_id", 1}};
  EXPECT_EQ(error_param(consumer, decode), "kv_transfer_params.remote_port");
  decode["kv_transfer_params"]["remote_port"] = 1;
  decode["kv_transfer_params"]["remote_request_id"] = "one";
  EXPECT_EQ(error_param(consumer, decode), "kv_transfer_params.remote_request_id");
  decode["kv_transfer_params"].erase("remote_host");
  decode["kv_transfer_params"]["remote_request_id"] = 1;
  EXPECT_EQ(error_param(consumer, decode), "kv_transfer_params.remote_host");
  EXPECT_EQ(error_param(producer, decode), "kv_transfer_params.do_remote_prefill");
  json object = Request(Prompt(8), 4);
  object["kv_transfer_params"] = "do_remote_prefill";
  EXPECT_EQ(error_param(consumer, object), "kv_transfer_params");
}

TEST(KvTransferApi, AnUnreachableProducerFailsTheRequestNotTheServer) {
  KvInstance consumer(KvTransferConfig::Role::kConsumer);
  afd::comm::Socket taken = afd::comm::Listen("127.0.0.1", 0);
  const int closed_port = afd::comm::LocalPort(taken);
  taken.Close();  // nothing listens there now
  json decode = Request(Prompt(8), 4);
  decode["kv_transfer_params"] = {{"do_remote_prefill", true},
                                  {"remote_host", "127.0.0.1"},
                                  {"remote_port", closed_port},
                                  {"remote_request_id", 1}};
  const auto start = std::chrono::steady_clock::now();
  const auto [status, r] = consumer.Post("/v1/completions", decode);
  EXPECT_EQ(status, 502) << r.dump();
  const std::string address = "127.0.0.1:" + std::to_string(closed_port);
  const std::string message = r["error"]["message"];
  EXPECT_NE(message.find(address), std::string::npos) << message;
  EXPECT_EQ(message.find(address), message.rfind(address))
      << "the address named twice: " << message;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
  EXPECT_EQ(consumer.Post("/v1/completions", Request(Prompt(4), 3)).first, 200);
}

// kv_load_failure_policy "recompute": a decode leg whose pull fails computes the whole prompt
// itself: a 200 with the same tokens as a colocated run.
TEST(KvTransferApi, RecomputePolicyRunsTheWholePromptWhenThePullFails) {
  KvInstance colocated(std::nullopt);
  KvInstance consumer(KvTransferConfig::Role::kConsumer, 2, 480, "preset:tiny",
                      KvTransferConfig::LoadFailurePolicy::kRecompute);
  afd::comm::Socket taken = afd::comm::Listen("127.0.0.1", 0);
  const int closed_port = afd::comm::LocalPort(taken);
  taken.Close();
  json decode = Request(Prompt(8), 4);
  const auto [want_status, want] = colocated.Post("/v1/completions", decode);
  ASSERT_EQ(want_status, 200) << want.dump();
  decode["kv_transfer_params"] = {{"do_remote_prefill", true},
                                  {"remote_host", "127.0.0.1"},
                                  {"remote_port", closed_port},
                                  {"remote_request_id", 1}};
  for (const bool stream : {false, true}) {
    decode["stream"] = stream;
    const auto [status, r] = consumer.Post("/v1/completions", decode);
    EXPECT_EQ(status, 200) << r.dump();
    if (!stream) {
      EXPECT_EQ(r["choices"][0]["token_ids"], want["choices"][0]["token_ids"]);
    }
  }
}

// Rows not pulled within the producer's hold timeout are freed there: a late decode leg gets a
// 502 naming the request, and the producer's cache holds nothing.
TEST(KvTransferApi, AnExpiredTransferIsA502AndFreesTheRows) {
  KvInstance producer(KvTransferConfig::Role::kProducer, 2, /*hold_timeout_s=*/0.2),
      consumer(KvTransferConfig::Role::kConsumer);
  json prefill = Request(Prompt(40), 1);
  prefill["kv_transfer_params"] = {{"do_remote_decode", true}};
  const auto [p_status, p] = producer.Post("/v1/completions", prefill);
  ASSERT_EQ(p_status, 200) << p.dump();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the hold timeout
  json decode = Request(Prompt(40), 4);
  decode["kv_transfer_params"] = p["kv_transfer_params"];
  const auto [status, r] = consumer.Post("/v1/completions", decode);
  EXPECT_EQ(status, 502) << r.dump();
  EXPECT_NE(r.dump().find("holds no KV rows"), std::string::npos) << r.dump();
  EXPECT_EQ(r["error"]["param"], "kv_transfer_params");
  for (int i = 0; i < 300 && producer.engine->Load().total.kv_held > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(producer.engine->Load().total.kv_held, 0);
  EXPECT_EQ(producer.engine->Load().total.kv_blocks_used, 0);
}

// A consumer that cannot use the rows (another model: the pull fails at the handshake) frees
// them on the producer at once: the producer holds nothing soon after the 502.
TEST(KvTransferApi, AFailedPullFreesTheProducersRows) {
  KvInstance producer(KvTransferConfig::Role::kProducer),
      consumer(KvTransferConfig::Role::kConsumer, 2, 480, "preset:tiny-qwen3");
  json prefill = Request(Prompt(40), 1);
  prefill["kv_transfer_params"] = {{"do_remote_decode", true}};
  const auto [p_status, p] = producer.Post("/v1/completions", prefill);
  ASSERT_EQ(p_status, 200) << p.dump();
  EXPECT_EQ(producer.engine->Load().total.kv_held, 1);
  json decode = Request(Prompt(40), 4);
  decode["kv_transfer_params"] = p["kv_transfer_params"];
  const auto [status, r] = consumer.Post("/v1/completions", decode);
  EXPECT_EQ(status, 502) << r.dump();
  EXPECT_NE(r.dump().find("serves model"), std::string::npos) << r.dump();
  bool freed = false;
  for (int i = 0; i < 500 && !freed; ++i) {
    freed = producer.engine->Load().total.kv_held == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(freed);
}

// Decode legs whose producer never answers wait on the pull threads, not on the endpoint
// workers: with more of them in flight than there are workers, a plain request is still answered;
// each leg ends within the transfer timeout -- a whole one as a 502, a streamed one (already
// answered 200) as an error event and [DONE].
TEST(KvTransferApi, SlowPullsDoNotHoldTheEndpointWorkers) {
  KvInstance consumer(KvTransferConfig::Role::kConsumer, /*transfer_timeout_s=*/6);
  afd::comm::Socket silent = afd::comm::Listen("127.0.0.1", 0);  // accepts, never speaks
  json decode = Request(Prompt(8), 4);
  decode["kv_transfer_params"] = {{"do_remote_prefill", true},
                                  {"remote_host", "127.0.0.1"},
                                  {"remote_port", afd::comm::LocalPort(silent)},
                                  {"remote_request_id", 1}};
  std::vector<std::future<std::pair<int, json>>> legs;
  for (int i = 0; i < 6; ++i) {  // more than the 4 endpoint workers
    legs.push_back(
        std::async(std::launch::async, [&] { return consumer.Post("/v1/completions", decode); }));
  }
  json streamed = decode;
  streamed["stream"] = true;
  auto streamed_leg = std::async(std::launch::async, [&] {
    httplib::Client c("127.0.0.1", consumer.server->port());
    c.set_read_timeout(30, 0);
    return c.Post("/v1/completions", streamed.dump(), "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (the legs reach their pulls)
  // Answered long before the pulls time out (a worker is free): its own read timeout is 3 s.
  httplib::Client plain("127.0.0.1", consumer.server->port());
  plain.set_read_timeout(3, 0);
  const auto r = plain.Post("/v1/completions", Request(Prompt(4), 3).dump(), "application/json");
  ASSERT_TRUE(r) << "a plain request waited for the pulls";
  EXPECT_EQ(r->status, 200) << r->body;
  for (auto& leg : legs) {
    const auto [status, body] = leg.get();
    EXPECT_EQ(status, 502) << body.dump();
    EXPECT_EQ(body["error"]["param"], "kv_transfer_params") << body.dump();
  }
  const auto s = streamed_leg.get();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("the KV transfer from the prefill instance failed"), std::string::npos)
      << s->body;
  EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos) << s->body;
  // Nothing is left in flight (every deferred response gave its count back).
  for (int i = 0; i < 100 && consumer.server->num_in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(consumer.server->num_in_flight(), 0);
}

}  // namespace
}  // namespace afd::server::test

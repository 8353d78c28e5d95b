// Prefill/decode disaggregation with the real commands (docs/pd.md): two `afd serve
// --kv-transfer-config` prefill instances (KV producers), one decode instance (a consumer) and
// `afd proxy` in front, each a process on this host. Every completion through the proxy equals
// `afd run`'s; SIGTERM stops each process with exit 0.
#include <gtest/gtest.h>

#include <filesystem>

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

  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {4, 5}, {6}, {7, 8, 9, 10, 11, 12}};
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens 6", &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Reply r = PostJson(proxy, "/v1/completions",
                             {{"prompt", prompts[i]},
                              {"max_tokens", 6},
                              {"ignore_eos", true},
                              {"temperature", 0},
                              {"return_token_ids", true}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i]) << i;
  }
  for (size_t i = procs.size(); i-- > 0;) procs[i]->Kill(SIGTERM);
  for (size_t i = 0; i < procs.size(); ++i) {
    EXPECT_EQ(procs[i]->Wait(Deadline::In(60)), std::optional<int>(0)) << "process " << i;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace afd::e2e

// The seed's per-role recipe as written: an FFN `afd serve` and an attention `afd serve` (which
// answers the OpenAI API) started independently on loopback, with no join secret, with the same
// one exported on both, and with two different ones (named by both sides). And every
// long-running command stops on SIGTERM / SIGINT within a bounded time, its ranks too, exit 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <string>
#include <thread>
#include <vector>

#include "afd/comm/socket.h"
#include "e2e/serve_harness.h"

namespace afd::e2e {
namespace {

std::string RoleConfig(const std::string& role, int port, int num_attention, int num_ffn,
                       int timeout_s) {
  return "{\"afd\": {\"role\": \"" + role +
         "\", \"connector\": \"P2pHostAFDConnector\", \"host\": \"127.0.0.1\", \"port\": " +
         std::to_string(port) + ", \"num_attention_ranks\": " + std::to_string(num_attention) +
         ", \"num_ffn_ranks\": " + std::to_string(num_ffn) +
         ", \"afd_process_group_timeout_s\": " + std::to_string(timeout_s) + "}}";
}

// The join secret of the processes started next (unset: none).
void SetSecret(const char* secret) {
  unsetenv("AFD_JOIN_SECRET_FILE");
  if (secret == nullptr) {
    unsetenv("AFD_JOIN_SECRET");
  } else {
    setenv("AFD_JOIN_SECRET", secret, 1);
  }
}

// An FFN role command (no API of its own), logging to dir/ffn.log.
std::unique_ptr<Subprocess> StartFfn(const std::string& dir, const std::string& cfg, int dp = 1,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {AFD_BINARY,
                                   "serve",
                                   "--model",
                                   "preset:tiny",
                                   "--device",
                                   "cpu",
                                   "--data-parallel-size",
                                   std::to_string(dp),
                                   "--tensor-parallel-size",
                                   "1",
                                   "--enable-expert-parallel",
                                   "--enforce-eager",
                                   "--additional-config",
                                   cfg,
                                   "--log-dir",
                                   dir + "/ffn_ranks"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (std::system("command -v setpriv >/dev/null 2>&1") == 0) {
    argv.insert(argv.begin(), {"setpriv", "--pdeathsig", "KILL", "--"});
  }
  return std::make_unique<Subprocess>(argv, dir + "/ffn.log");
}

std::string TestDir(const std::string& tag) {
  const std::string dir =
      ::testing::TempDir() + "/role_commands_" + tag + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// FFN command, then the attention command serving the API; one completion equals `afd run`;
// SIGTERM to the attention command: it drains and exits 0, the FFN command then ends (exit 0).
void ServeTheRecipe(const char* ffn_secret, const char* attention_secret, const std::string& tag) {
  const std::string dir = TestDir(tag);
  const int port = comm::PickRendezvousPort();
  SetSecret(ffn_secret);
  auto ffn = StartFfn(dir, RoleConfig("ffn", port, 2, 1, 60));
  SetSecret(attention_secret);
  ServedProcess attention(
      tag, {"serve", "--model", "preset:tiny", "--device", "cpu", "--data-parallel-size", "2",
            "--tensor-parallel-size", "1", "--enable-expert-parallel", "--enforce-eager",
            "--additional-config", RoleConfig("attention", port, 2, 1, 60)});
  ASSERT_TRUE(attention.up()) << attention.Log() << ReadFile(dir + "/ffn.log");
  const Reply r = PostJson(attention.port(), "/v1/completions",
                           {{"prompt", {1, 2, 3}},
                            {"max_tokens", 5},
                            {"ignore_eos", true},
                            {"temperature", 0},
                            {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  std::string error;
  const auto want = RunReference({{1, 2, 3}}, "--max-tokens 5", &error);
  ASSERT_EQ(want.size(), 1u) << error;
  EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[0]) << r.raw;
  attention.Signal(SIGTERM);
  EXPECT_EQ(attention.Wait(30), std::optional<int>(0)) << attention.Log();
  EXPECT_EQ(ffn->Wait(Deadline::In(30)), std::optional<int>(0)) << ReadFile(dir + "/ffn.log");
  SetSecret(nullptr);
  std::filesystem::remove_all(dir);
}

TEST(RoleCommands, SeedRecipeOnLoopbackWithoutAJoinSecret) {
  ServeTheRecipe(nullptr, nullptr, "open");
}

TEST(RoleCommands, SeedRecipeWithTheSameSecretOnBoth) {
  ServeTheRecipe("0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef", "shared");
}

// Different secrets: the attention side names the refusal; the FFN side (whose store refused the
// attention ranks) names the failed authentication; neither waits past its timeout.
TEST(RoleCommands, DifferentSecretsAreNamedByBothSides) {
  const std::string dir = TestDir("mismatch");
  const int port = comm::PickRendezvousPort();
  SetSecret("ffn-secret-0123456789abcdef");
  auto ffn = StartFfn(dir, RoleConfig("ffn", port, 1, 1, 8));
  SetSecret("attention-secret-0123456789abcdef");
  ServedProcess attention("mismatch",
                          {"serve", "--model", "preset:tiny", "--additional-config",
                           RoleConfig("attention", port, 1, 1, 8)},
                          /*ready_timeout_s=*/5);
  SetSecret(nullptr);
  EXPECT_FALSE(attention.up());
  EXPECT_EQ(attention.Wait(60), std::optional<int>(1)) << attention.Log();
  const std::optional<int> ffn_rc = ffn->Wait(Deadline::In(60));
  ASSERT_TRUE(ffn_rc.has_value()) << ReadFile(dir + "/ffn.log");
  EXPECT_NE(*ffn_rc, 0);
  EXPECT_NE(attention.Log().find("different secrets"), std::string::npos) << attention.Log();
  const std::string ffn_log = ReadFile(dir + "/ffn.log");
  EXPECT_NE(ffn_log.find("authenticat"), std::string::npos) << ffn_log;
  std::filesystem::remove_all(dir);
}

// The multi-host DP flags of an attention command: DP 2, the API server's engine listener on
// 127.0.0.1:rpc, `local` DP ranks on the command's host.
std::vector<std::string> MultiHostDp(int rpc, int local) {
  return {"--data-parallel-size",       "2",
          "--data-parallel-address",    "127.0.0.1",
          "--data-parallel-rpc-port",   std::to_string(rpc),
          "--data-parallel-size-local", std::to_string(local)};
}

// A headless attention command (its DP ranks from `start`), logging to dir/headless.log.
std::unique_ptr<Subprocess> StartHeadless(const std::string& dir, int port, int rpc, int start,
                                          int local, int timeout_s,
                                          const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {AFD_BINARY,
                                   "serve",
                                   "--model",
                                   "preset:tiny",
                                   "--additional-config",
                                   RoleConfig("attention", port, 2, 1, timeout_s),
                                   "--headless",
                                   "--data-parallel-start-rank",
                                   std::to_string(start)};
  const std::vector<std::string> dp = MultiHostDp(rpc, local);
  argv.insert(argv.end(), dp.begin(), dp.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<Subprocess>(argv, dir + "/headless.log");
}

// The arguments of the API server's command (DP ranks 0 .. local-1 on its host).
std::vector<std::string> HeadArgs(int port, int rpc, int local, int timeout_s) {
  std::vector<std::string> args = {"serve", "--model", "preset:tiny", "--additional-config",
                                   RoleConfig("attention", port, 2, 1, timeout_s)};
  const std::vector<std::string> dp = MultiHostDp(rpc, local);
  args.insert(args.end(), dp.begin(), dp.end());
  return args;
}

// One greedy completion of `prompt` through the API at `port` equals `afd run`.
void ExpectCompletionEqualsAfdRun(int port, const std::vector<int>& prompt) {
  std::string error;
  const auto want = RunReference({prompt}, "--max-tokens 5", &error);
  ASSERT_EQ(want.size(), 1u) << error;
  const Reply r = PostJson(port, "/v1/completions",
                           {{"prompt", prompt},
                            {"max_tokens", 5},
                            {"ignore_eos", true},
                            {"temperature", 0},
                            {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[0]);
}

// vLLM's multi-node DP as seed 004 lays it out: an FFN host, an attention host whose API server
// runs DP rank 0 and listens for the others (--data-parallel-address / --data-parallel-rpc-port),
// and a headless attention host running DP rank 1 (all on loopback here;
// tests/deploy/netns_multipod_test.sh runs it across network namespaces). Requests reach both
// replicas and equal `afd run`; SIGTERM to the API server drains it, the headless host's replica
// leaves and every command exits 0. `secret`: the join secret exported on every command (the
// engine channel proves it too).
void HeadAndHeadless(const char* secret, const std::string& tag) {
  const std::string dir = TestDir(tag);
  const int port = comm::PickRendezvousPort();
  const int rpc = comm::PickRendezvousPort();
  SetSecret(secret);
  auto ffn =
      StartFfn(dir, RoleConfig("ffn", port, 2, 1, 60), 1, {"--ready-file", dir + "/ffn.ready"});
  auto headless = StartHeadless(
      dir, port, rpc, 1, 1, 60,
      {"--log-dir", dir + "/headless_ranks", "--ready-file", dir + "/headless.ready"});
  ServedProcess head(tag, HeadArgs(port, rpc, 1, 60));
  ASSERT_TRUE(head.up()) << head.Log() << ReadFile(dir + "/headless.log")
                         << ReadFile(dir + "/ffn.log");
  // The pods without an API say they are ready once their ranks joined (--ready-file).
  EXPECT_TRUE(PollUntil(10,
                        [&] {
                          return std::filesystem::exists(dir + "/ffn.ready") &&
                                 std::filesystem::exists(dir + "/headless.ready");
                        }))
      << ReadFile(dir + "/ffn.log") << ReadFile(dir + "/headless.log");
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {4, 5}, {6}, {7, 8, 9, 10}};
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens 6", &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  // Concurrently, so that the least-loaded routing spreads them over both replicas.
  std::vector<std::thread> clients;
  std::vector<Reply> replies(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      replies[i] = PostJson(head.port(), "/v1/completions",
                            {{"prompt", prompts[i]},
                             {"max_tokens", 6},
                             {"ignore_eos", true},
                             {"temperature", 0},
                             {"return_token_ids", true}});
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(replies[i].status, 200) << replies[i].raw;
    EXPECT_EQ(replies[i].body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i]) << i;
  }
  head.Signal(SIGTERM);
  EXPECT_EQ(head.Wait(30), std::optional<int>(0)) << head.Log();
  EXPECT_EQ(headless->Wait(Deadline::In(30)), std::optional<int>(0))
      << ReadFile(dir + "/headless.log");
  // The headless host's replica (DP rank 1) took its share of the requests, then left.
  const std::string replica_log = ReadFile(dir + "/headless_ranks/attention1.log");
  const size_t at = replica_log.find("attention replica 1: served ");
  ASSERT_NE(at, std::string::npos) << replica_log;
  EXPECT_GE(std::stoi(replica_log.substr(at + 28)), 1) << replica_log;
  EXPECT_EQ(ffn->Wait(Deadline::In(30)), std::optional<int>(0)) << ReadFile(dir + "/ffn.log");
  EXPECT_FALSE(std::filesystem::exists(dir + "/ffn.ready"));  // not ready once stopped
  EXPECT_FALSE(std::filesystem::exists(dir + "/headless.ready"));
  SetSecret(nullptr);
  std::filesystem::remove_all(dir);
}

TEST(RoleCommands, HeadAndHeadlessAttentionHosts) { HeadAndHeadless(nullptr, "headless"); }

TEST(RoleCommands, HeadAndHeadlessAttentionHostsWithASecret) {
  HeadAndHeadless("0123456789abcdef0123456789abcdef", "headless_secret");
}

// --data-parallel-size-local 0: an API server with no replica of its own; both DP ranks run on
// one headless host.
TEST(RoleCommands, ApiServerOnlyWithEveryReplicaHeadless) {
  const std::string dir = TestDir("api_only");
  const int port = comm::PickRendezvousPort();
  const int rpc = comm::PickRendezvousPort();
  SetSecret(nullptr);
  auto ffn = StartFfn(dir, RoleConfig("ffn", port, 2, 1, 60));
  auto headless = StartHeadless(dir, port, rpc, 0, 2, 60);
  ServedProcess head("api_only", HeadArgs(port, rpc, 0, 60));
  ASSERT_TRUE(head.up()) << head.Log() << ReadFile(dir + "/headless.log");
  EXPECT_TRUE(RankProcessesOf(head.pid()).empty());  // no rank of its own
  ExpectCompletionEqualsAfdRun(head.port(), {3, 1, 4});
  head.Signal(SIGTERM);
  EXPECT_EQ(head.Wait(30), std::optional<int>(0)) << head.Log();
  EXPECT_EQ(headless->Wait(Deadline::In(30)), std::optional<int>(0))
      << ReadFile(dir + "/headless.log");
  EXPECT_EQ(ffn->Wait(Deadline::In(30)), std::optional<int>(0)) << ReadFile(dir + "/ffn.log");
  std::filesystem::remove_all(dir);
}

// A headless host's rank that dies is named by the API server, which stops (its deployment has
// lost a replica and the FFN ranks their peer): docs/deploy.md.
TEST(RoleCommands, ADeadHeadlessReplicaIsNamedAndStopsTheServer) {
  const std::string dir = TestDir("headless_dies");
  const int port = comm::PickRendezvousPort();
  const int rpc = comm::PickRendezvousPort();
  SetSecret(nullptr);
  auto ffn = StartFfn(dir, RoleConfig("ffn", port, 2, 1, 30));
  auto headless = StartHeadless(dir, port, rpc, 1, 1, 30);
  ServedProcess head("headless_dies", HeadArgs(port, rpc, 1, 30));
  ASSERT_TRUE(head.up()) << head.Log() << ReadFile(dir + "/headless.log");
  const std::vector<RankProcess> ranks = RankProcessesOf(headless->pid());
  ASSERT_EQ(ranks.size(), 1u);
  ::kill(ranks[0].pid, SIGKILL);
  EXPECT_EQ(head.Wait(60), std::optional<int>(1)) << head.Log();
  // Named either way: by the engine channel ("attention replica 1 lost its engine
  // connection") or by the local rank that lost its peer ("world rank 2 (attention 1)").
  const std::string log = head.Log();
  EXPECT_TRUE(log.find("attention replica 1 lost its engine connection") != std::string::npos ||
              log.find("(attention 1)") != std::string::npos)
      << log;
  EXPECT_TRUE(headless->Wait(Deadline::In(30)).has_value());
  EXPECT_TRUE(ffn->Wait(Deadline::In(60)).has_value()) << ReadFile(dir + "/ffn.log");
  std::filesystem::remove_all(dir);
}

// A headless host with another secret than the API server's is refused on the engine channel
// (named on both sides); the API server goes on waiting for the replica (its ready timeout
// names it) and stops on SIGTERM.
TEST(RoleCommands, HeadlessHostWithAnotherSecretIsRefused) {
  const std::string dir = TestDir("headless_mismatch");
  const int port = comm::PickRendezvousPort();
  const int rpc = comm::PickRendezvousPort();
  SetSecret("the-secret-of-the-ffn-and-the-head");
  auto ffn = StartFfn(dir, RoleConfig("ffn", port, 2, 1, 60));
  ServedProcess head("headless_mismatch", HeadArgs(port, rpc, 1, 60), /*ready_timeout_s=*/3);
  SetSecret("another-secret-of-the-headless-host");
  auto headless = StartHeadless(dir, port, rpc, 1, 1, 60);
  SetSecret(nullptr);
  const std::optional<int> rc = headless->Wait(Deadline::In(60));
  ASSERT_TRUE(rc.has_value()) << ReadFile(dir + "/headless.log");
  EXPECT_NE(*rc, 0);
  const std::string log = ReadFile(dir + "/headless.log");
  // Its rank meets the store first (another secret there too) or the engine channel: either
  // way the secrets are named.
  EXPECT_TRUE(log.find("secret") != std::string::npos) << log;
  EXPECT_FALSE(head.up());
  head.Signal(SIGTERM);
  EXPECT_EQ(head.Wait(30), std::optional<int>(0)) << head.Log();
  std::filesystem::remove_all(dir);
}

// SIGTERM and SIGINT stop an FFN role command whose attention ranks never came: at once, its
// ranks too, exit 0.
TEST(RoleCommands, FfnRoleCommandStopsOnSigtermAndSigint) {
  for (const int sig : {SIGTERM, SIGINT}) {
    const std::string dir = TestDir("ffn_stop");
    SetSecret(nullptr);
    auto ffn = StartFfn(dir, RoleConfig("ffn", comm::PickRendezvousPort(), 2, 2, 120), 2);
    // Both ranks started (and waiting for the attention ranks).
    ASSERT_TRUE(PollUntil(30, [&] { return RankProcessesOf(ffn->pid()).size() == 2; }))
        << ReadFile(dir + "/ffn.log");
    const auto ranks = RankProcessesOf(ffn->pid());
    const Deadline start = Deadline::In(15);
    ffn->Kill(sig);
    EXPECT_EQ(ffn->Wait(start), std::optional<int>(0)) << ReadFile(dir + "/ffn.log");
    EXPECT_FALSE(start.expired());
    EXPECT_NE(ReadFile(dir + "/ffn.log").find("stopping the 2 rank(s)"), std::string::npos);
    for (const auto& r : ranks) EXPECT_NE(::kill(r.pid, 0), 0) << "rank " << r.pid << " left";
    std::filesystem::remove_all(dir);
  }
}

// A rank process alone (`afd worker`) ends on SIGTERM at once, exit 0.
TEST(RoleCommands, WorkerStopsOnSigterm) {
  const std::string dir = TestDir("worker_stop");
  SetSecret(nullptr);
  Subprocess worker(
      {AFD_BINARY, "worker", "--model", "preset:tiny", "--role-rank", "0", "--additional-config",
       RoleConfig("ffn", comm::PickRendezvousPort(), 1, 1, 120)},
      dir + "/worker.log");
  // Running: it has resolved its (absent) join secret and waits for its peers.
  ASSERT_TRUE(PollUntil(30, [&] {
    return ReadFile(dir + "/worker.log").find("no join secret") != std::string::npos;
  })) << ReadFile(dir + "/worker.log");
  worker.Kill(SIGTERM);
  EXPECT_EQ(worker.Wait(Deadline::In(10)), std::optional<int>(0)) << ReadFile(dir + "/worker.log");
  EXPECT_NE(ReadFile(dir + "/worker.log").find("SIGTERM: stopping"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace afd::e2e

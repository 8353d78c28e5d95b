// recipes/: seed 004's multipod scripts, one POD at a time, run on one machine with the
// addresses set to 127.0.0.1 and the CPU: POD unset or unknown is an error listing the pods;
// the pods of a recipe together serve the OpenAI API with `afd run`'s results and stop on
// SIGTERM to the API pod.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "afd/comm/socket.h"
#include "e2e/serve_harness.h"

namespace afd::e2e {
namespace {

const std::string kRecipes = std::string(AFD_SOURCE_DIR) + "/recipes/";

// Runs `recipe` with POD=pod and the environment of a one-machine run.
std::unique_ptr<Subprocess> Pod(const std::string& recipe, const std::string& pod, int port,
                                int rpc, const std::string& log) {
  std::vector<std::string> argv = {"env",
                                   "POD=" + pod,
                                   std::string("AFD=") + AFD_BINARY,
                                   "MODEL_PATH=preset:tiny",
                                   "DEVICE=cpu",
                                   "AFD_CONNECTOR_HOST=127.0.0.1",
                                   "AFD_CONNECTOR_PORT=" + std::to_string(port),
                                   "ATTENTION_DP_ADDRESS=127.0.0.1",
                                   "ATTENTION_DP_RPC_PORT=" + std::to_string(rpc),
                                   "API_HOST=127.0.0.1",
                                   "API_PORT=0",
                                   "bash",
                                   kRecipes + recipe};
  if (std::system("command -v setpriv >/dev/null 2>&1") == 0) {
    argv.insert(argv.begin(), {"setpriv", "--pdeathsig", "KILL", "--"});
  }
  return std::make_unique<Subprocess>(argv, log);
}

// The port of "the OpenAI API is up on http://127.0.0.1:PORT" in `log_path`, within timeout_s.
int ApiPort(const std::string& log_path, double timeout_s) {
  const std::string kUp = "the OpenAI API is up on http://127.0.0.1:";
  int port = 0;
  PollUntil(timeout_s, [&] {
    const std::string log = ReadFile(log_path);
    const size_t at = log.find(kUp);
    if (at == std::string::npos || log.find(' ', at + kUp.size()) == std::string::npos) {
      return false;
    }
    port = std::stoi(log.substr(at + kUp.size()));
    return true;
  });
  return port;
}

std::string TestDir(const std::string& tag) {
  const std::string dir = ::testing::TempDir() + "/recipes_" + tag + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(Recipes, PodUnsetOrUnknownIsAnErrorListingThePods) {
  for (const char* recipe : {"multipod_4a_2f.sh", "multipod_2a_2f_dbo_tp2.sh"}) {
    for (const char* pod : {"", "DECODE_0"}) {
      const std::string cmd = std::string("env POD=") + pod + " bash " + kRecipes + recipe +
                              " > /tmp/recipe_out_" + std::to_string(getpid()) + " 2>&1";
      const int status = std::system(cmd.c_str());
      EXPECT_EQ(WEXITSTATUS(status), 2) << recipe << " POD=" << pod;
      const std::string out = ReadFile("/tmp/recipe_out_" + std::to_string(getpid()));
      EXPECT_NE(out.find("FFN_0"), std::string::npos) << out;
      EXPECT_NE(out.find("ATTENTION_0"), std::string::npos) << out;
    }
  }
}

// `pods`: the recipe's pods, the API pod last.
void RunRecipe(const std::string& recipe, const std::vector<std::string>& pods,
               const std::string& tag) {
  const std::string dir = TestDir(tag);
  const int port = comm::PickRendezvousPort();
  const int rpc = comm::PickRendezvousPort();
  unsetenv("AFD_JOIN_SECRET");
  unsetenv("AFD_JOIN_SECRET_FILE");
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (const auto& pod : pods) {
    procs.push_back(Pod(recipe, pod, port, rpc, dir + "/" + pod + ".log"));
  }
  const std::string api_log = dir + "/" + pods.back() + ".log";
  const int api = ApiPort(api_log, 60);
  ASSERT_GT(api, 0) << ReadFile(api_log);
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {4, 5}, {6}, {7, 8, 9}};
  std::string error;
  const auto want = RunReference(prompts, "--max-tokens 5", &error);
  ASSERT_EQ(want.size(), prompts.size()) << error;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Reply r = PostJson(api, "/v1/completions",
                             {{"prompt", prompts[i]},
                              {"max_tokens", 5},
                              {"ignore_eos", true},
                              {"temperature", 0},
                              {"return_token_ids", true}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["token_ids"].get<std::vector<int>>(), want[i]) << i;
  }
  procs.back()->Kill(SIGTERM);
  for (size_t i = procs.size(); i-- > 0;) {
    EXPECT_EQ(procs[i]->Wait(Deadline::In(60)), std::optional<int>(0))
        << pods[i] << ": " << ReadFile(dir + "/" + pods[i] + ".log");
  }
  std::filesystem::remove_all(dir);
}

TEST(Recipes, Multipod4A2FWithAHeadlessPod) {
  RunRecipe("multipod_4a_2f.sh", {"FFN_0", "ATTENTION_1", "ATTENTION_0"}, "4a2f");
}

TEST(Recipes, Multipod2A2FDboTp2) {
  RunRecipe("multipod_2a_2f_dbo_tp2.sh", {"FFN_0", "ATTENTION_0"}, "2a2f");
}

}  // namespace
}  // namespace afd::e2e

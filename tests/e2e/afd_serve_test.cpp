// Role processes started independently, one command per role and host, with the seed recipes'
// flags: `afd serve` for the FFN role (DP2) and the attention role split over two "hosts"
// (DP3: --data-parallel-size-local / --data-parallel-start-rank), against the monolithic run.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "afd/comm/socket.h"
#include "afd/common/subprocess.h"
#include "testing/files.h"

namespace afd {
namespace {

using nlohmann::json;

using testing_util::ReadFile;

// `ffn_dbo`: whether the FFN command also gets --enable-dbo and its thresholds.
void RunRecipeAgainstMonolithic(const std::string& connector, bool ffn_dbo,
                                const std::string& tag_prefix) {
  const std::string dir = ::testing::TempDir() + "/afd_serve_test_" + tag_prefix;
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8}, {9}, {10, 11}};
  std::ofstream(dir + "/prompts.json") << json(prompts).dump();
  const int port = comm::PickRendezvousPort();
  auto cfg = [&](const std::string& role) {
    return "{\"afd\": {\"role\": \"" + role + "\", \"connector\": \"" + connector + "\", " +
           "\"host\": \"127.0.0.1\", \"port\": " + std::to_string(port) +
           ", \"num_attention_ranks\": 3, \"num_ffn_ranks\": 2, "
           "\"afd_process_group_timeout_s\": 30}}";
  };
  // The flags of the seed's recipe scripts, which port by renaming the binary.
  const std::vector<std::string> common = {"--model",
                                           "preset:tiny",
                                           "--device",
                                           "cpu",
                                           "--tensor-parallel-size",
                                           "1",
                                           "--max-tokens",
                                           "5",
                                           "--enable-expert-parallel",
                                           "--enforce-eager",
                                           "--enable-dbo",
                                           "--dbo-decode-token-threshold",
                                           "2",
                                           "--dbo-prefill-token-threshold",
                                           "12",
                                           "--host",
                                           "127.0.0.1",
                                           "--port",
                                           "18000"};
  auto serve = [&](const std::string& role, std::vector<std::string> extra,
                   const std::string& tag) {
    std::vector<std::string> argv = {AFD_BINARY, "serve",     "--additional-config",
                                     cfg(role),  "--log-dir", dir + "/" + tag};
    for (size_t i = 0; i < common.size(); ++i) {
      const bool dbo_flag = common[i].rfind("--dbo-", 0) == 0 || common[i] == "--enable-dbo";
      if (role == "ffn" && !ffn_dbo && dbo_flag) {
        if (common[i] != "--enable-dbo") ++i;  // and its value
        continue;
      }
      argv.push_back(common[i]);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Subprocess>(argv, dir + "/" + tag + ".log");
  };
  auto ffn = serve("ffn", {"--data-parallel-size", "2"}, "ffn");
  auto host_a = serve(
      "attention",
      {"--data-parallel-size", "3", "--data-parallel-size-local", "2", "--data-parallel-start-rank",
       "0", "--prompts-file", dir + "/prompts.json", "--output-file", dir + "/host_a.jsonl"},
      "attn_a");
  auto host_b = serve(
      "attention",
      {"--data-parallel-size", "3", "--data-parallel-size-local", "1", "--data-parallel-start-rank",
       "2", "--prompts-file", dir + "/prompts.json", "--output-file", dir + "/host_b.jsonl"},
      "attn_b");
  for (auto* p : {ffn.get(), host_a.get(), host_b.get()}) {
    EXPECT_EQ(p->Wait(Deadline::In(120)), 0)
        << ReadFile(dir + "/ffn.log") << ReadFile(dir + "/attn_a.log")
        << ReadFile(dir + "/attn_b.log");
  }
  // Results of both attention hosts, by prompt index.
  std::map<int, json> got;
  for (const char* f : {"/host_a.jsonl", "/host_b.jsonl"}) {
    std::stringstream ss(ReadFile(dir + f));
    for (std::string line; std::getline(ss, line);) {
      const json j = json::parse(line);
      got[j["index"].get<int>()] = j["result"];
    }
  }
  ASSERT_EQ(got.size(), prompts.size());
  // Replica 2 (host b) holds prompt 2 only: i % 3 == 2.
  EXPECT_EQ(json::parse(ReadFile(dir + "/host_b.jsonl"))["index"], 2);
  std::string cmd = std::string(AFD_BINARY) + " run --model preset:tiny --max-tokens 5 --json";
  for (const auto& p : prompts) {
    cmd += " --prompt-ids ";
    for (size_t i = 0; i < p.size(); ++i) {
      if (i > 0) cmd += ",";
      cmd += std::to_string(p[i]);
    }
  }
  const int rc = std::system((cmd + " > " + dir + "/mono.jsonl").c_str());
  ASSERT_EQ(rc, 0);
  std::stringstream mono(ReadFile(dir + "/mono.jsonl"));
  int i = 0;
  for (std::string line; std::getline(mono, line); ++i) {
    const json m = json::parse(line);
    EXPECT_EQ(got[i]["output_ids"], m["output_ids"]) << "prompt " << i;
    for (size_t j = 0; j < m["logprobs"].size(); ++j) {
      EXPECT_NEAR(got[i]["logprobs"][j].get<double>(), m["logprobs"][j].get<double>(), 1e-5);
    }
  }
}

TEST(AfdServe, RecipeShapedRoleCommandsMatchTheMonolithicRun) {
  RunRecipeAgainstMonolithic("P2pHostAFDConnector", /*ffn_dbo=*/true, "p2p");
}

// The asynchronous connector's windows with DBO given to the attention commands only: the
// windows take the attention ranks' ring of two (DBO's micro-batches), the same results.
TEST(AfdServe, AsyncRoleCommandsWithDboOnTheAttentionSideOnly) {
  RunRecipeAgainstMonolithic("AsyncAFDConnector", /*ffn_dbo=*/false, "async");
}

TEST(AfdServe, ReplicasWithoutPromptsOnlyTakeEmptySteps) {
  // 4A2F with one prompt: three DP replicas have nothing to do and run empty steps throughout.
  const std::string base =
      std::string(AFD_BINARY) + " run --model preset:tiny --max-tokens 6 --json --prompt-ids 5,6,7";
  const std::string dir = ::testing::TempDir();
  ASSERT_EQ(std::system((base + " > " + dir + "/one_mono.jsonl").c_str()), 0);
  ASSERT_EQ(std::system((base + " --topology 4A2F > " + dir + "/one_afd.jsonl").c_str()), 0);
  EXPECT_EQ(ReadFile(dir + "/one_afd.jsonl"), ReadFile(dir + "/one_mono.jsonl"));
}

}  // namespace
}  // namespace afd

// `afd run` as a user runs it: JSON lines against the transformers golden data, --dump-logits
// against the golden logits, the human output, and exit codes for bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/npy_reader.h"
#include "testing/command.h"

namespace {

using nlohmann::json;

using Result = afd::testing_util::CommandResult;

Result RunAfd(const std::string& args, bool stderr_too = false) {
  return afd::testing_util::RunCommand(std::string(AFD_BINARY) + " " + args +
                                       (stderr_too ? " 2>&1" : " 2>/dev/null"));
}

std::string Golden(const std::string& name) {
  return std::string(AFD_SOURCE_DIR) + "/tests/data/golden/" + name;
}

std::string Ids(const json& ids) {
  std::string s;
  for (const auto& id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id.get<int>());
  }
  return s;
}

TEST(RunCmd, JsonLinesMatchGolden) {
  const std::string dir = Golden("v3_sharded");
  std::ifstream in(dir + "/golden.json");
  const json golden = json::parse(in);
  std::string args = "run --model " + dir + " --max-tokens 12 --ignore-eos --json";
  for (const auto& p : golden["prompts"]) args += " --prompt-ids " + Ids(p);
  const Result r = RunAfd(args);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  size_t i = 0;
  for (; std::getline(lines, line); ++i) {
    const json j = json::parse(line);
    ASSERT_LT(i, golden["prompts"].size());
    EXPECT_EQ(j["prompt_ids"], golden["prompts"][i]);
    EXPECT_EQ(j["output_ids"], golden["greedy_output_ids"][i]);
    ASSERT_EQ(j["prompt_logprobs"].size(), golden["prompts"][i].size());
    EXPECT_TRUE(j["prompt_logprobs"][0].is_null());
    for (size_t k = 1; k < j["prompt_logprobs"].size(); ++k) {
      EXPECT_NEAR(j["prompt_logprobs"][k].get<double>(),
                  golden["prompt_logprobs"][i][k].get<double>(), 1e-4);
    }
    EXPECT_EQ(j["logprobs"].size(), 12u);
  }
  EXPECT_EQ(i, golden["prompts"].size());
}

TEST(RunCmd, DumpLogitsMatchesGolden) {
  const std::string dir = Golden("v2_greedy_yarn");
  std::ifstream in(dir + "/golden.json");
  const json golden = json::parse(in);
  const std::string npy =
      (std::filesystem::temp_directory_path() / ("afd_logits_" + std::to_string(getpid()) + ".npy"))
          .string();
  const Result r = RunAfd("run --model " + dir + " --max-tokens 0 --dump-logits " + npy +
                          " --prompt-ids " + Ids(golden["prompts"][2]));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto got = afd::testing::ReadNpyF32(npy);
  const auto ref = afd::testing::ReadNpyF32(dir + "/logits_2.npy");
  std::filesystem::remove(npy);
  ASSERT_EQ(got.shape, ref.shape);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.data.size(); ++i) {
    num += std::pow(double(got.data[i]) - ref.data[i], 2);
    den += std::pow(double(ref.data[i]), 2);
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4);
}

TEST(RunCmd, PresetTinyAndBadInput) {
  Result r = RunAfd(
      "run --model preset:tiny --prompt-ids 1,2,3 --prompt-ids 4 --max-tokens 5 "
      "--ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("prompt 1 (1 tokens) ->"), std::string::npos) << r.out;

  for (const char* bad :
       {"run --model preset:tiny --prompt-ids 1,x", "run --model preset:tiny --prompt-ids 1,,2",
        "run --model preset:tiny --prompt-ids 5000", "run --model preset:nope --prompt-ids 1",
        "run --model /nonexistent/dir --prompt-ids 1",
        "run --model preset:tiny --prompt-ids 1 --top-p 0",
        "run --model preset:tiny --prompt-ids 1 --max-tokens 5000",
        "run --model preset:tiny --prompt-ids 1 --prompt-ids 2 --dump-logits x.npy",
        "run --prompt-ids 1"}) {
    r = RunAfd(bad, true);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.out;
    EXPECT_FALSE(r.out.empty()) << bad;
  }
}

}  // namespace

// The demo model (models/demo, `make demo`): `afd run` reproduces transformers' fp32 greedy
// continuations stored beside it (reference.json, made by tools/demo_model/train_demo_model.py)
// in one process and as AFD deployments of both connectors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "testing/command.h"
#include "testing/files.h"

namespace afd {
namespace {

using nlohmann::json;

const std::string kDemo = std::string(AFD_SOURCE_DIR) + "/models/demo";

class DemoModel : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(DemoModel, ReproducesTransformersGreedyIds) {
  const json ref = json::parse(testing_util::ReadFile(kDemo + "/reference.json"));
  ASSERT_GE(ref["cases"].size(), 6u);
  std::string cmd = std::string(AFD_BINARY) + " run --model '" + kDemo + "' --json --ignore-eos" +
                    " --max-tokens " + std::to_string(ref["max_new_tokens"].get<int>());
  for (const std::string& a : GetParam()) cmd += " '" + a + "'";
  for (const json& c : ref["cases"]) {
    std::string ids;
    for (const json& id : c["prompt_ids"]) {
      if (!ids.empty()) ids += ',';
      ids += id.dump();
    }
    cmd += " --prompt-ids " + ids;
  }
  const testing_util::CommandResult r = testing_util::RunCommand(cmd + " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.out;
  std::stringstream lines(r.out);
  size_t i = 0;
  for (std::string line; std::getline(lines, line);) {
    ASSERT_LT(i, ref["cases"].size()) << r.out;
    EXPECT_EQ(json::parse(line)["output_ids"], ref["cases"][i]["greedy_ids"]) << "case " << i;
    ++i;
  }
  EXPECT_EQ(i, ref["cases"].size()) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Deployments, DemoModel,
    ::testing::Values(std::vector<std::string>{}, std::vector<std::string>{"--topology", "1A2F"},
                      std::vector<std::string>{"--topology", "2A1F", "--additional-config",
                                               R"({"afd": {"connector": "AsyncAFDConnector"}})"}),
    [](const auto& info) {
      return info.param.empty() ? std::string("monolithic")
                                : info.param[1] + (info.param.size() > 2 ? "_async" : "");
    });

}  // namespace
}  // namespace afd

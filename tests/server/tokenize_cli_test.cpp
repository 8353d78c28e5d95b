// `afd tokenize` as a user runs it: one answer per line in order, errors on their line, exit 1.
#include <gtest/gtest.h>

#include "text/reference.h"

namespace afd::test {
namespace {

using json = nlohmann::ordered_json;

TEST(server_TokenizeCli, AnswersEveryLineAndFlagsBadOnes) {
  const std::string dir = DataPath("synthetic/llama_byte_fallback");
  const std::string input = ::testing::TempDir() + "/afd_tokenize_cli_" + std::to_string(getpid());
  {
    std::ofstream out(input);
    out << R"({"text": "Hello world"})"
        << "\n"
        << "not json\n"
        << R"({"ids": "nope"})"
        << "\n"
        << R"({"messages": [{"role": "user", "content": "hi"}]})"
        << "\n"
        << R"({"other": 1})"
        << "\n"
        << R"({"ids": [1, 5, 6]})"
        << "\n"
        << R"({"ids": [1, 99999999]})"
        << "\n";
  }
  int exit_code = -1;
  const std::vector<json> plain = RunAfdTokenize(dir, input, false, &exit_code);
  EXPECT_EQ(exit_code, 1);
  ASSERT_EQ(plain.size(), 7u);
  ASSERT_TRUE(plain[0].contains("ids"));
  EXPECT_TRUE(plain[1].contains("error"));
  EXPECT_TRUE(plain[2].contains("error"));
  // The directory's chat_template.jinja (Mistral style) renders the messages.
  EXPECT_EQ(plain[3].value("prompt", ""), "<s> [INST] hi [/INST]") << plain[3].dump();
  EXPECT_TRUE(plain[3].contains("ids"));
  EXPECT_TRUE(plain[4].contains("error"));
  EXPECT_TRUE(plain[5].contains("text"));
  // An id past the vocabulary is named, never decoded to "" without a word.
  ASSERT_TRUE(plain[6].contains("error")) << plain[6].dump();
  EXPECT_NE(plain[6]["error"].get<std::string>().find("99999999 is not a token"), std::string::npos)
      << plain[6].dump();
  const std::vector<json> special = RunAfdTokenize(dir, input, true);
  ASSERT_EQ(special.size(), 7u);
  json expected = json::array({1});  // the template's <s> in front
  for (const auto& id : plain[0]["ids"]) expected.push_back(id);
  EXPECT_EQ(special[0]["ids"], expected);
}

TEST(server_TokenizeCli, GoodInputExitsZeroAndMissingDirFails) {
  const std::string input = ::testing::TempDir() + "/afd_tokenize_ok_" + std::to_string(getpid());
  {
    std::ofstream(input) << R"({"text": ""})"
                         << "\n";
  }
  int exit_code = -1;
  const auto out =
      RunAfdTokenize(DataPath("synthetic/gpt2_ignore_merges"), input, false, &exit_code);
  EXPECT_EQ(exit_code, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], json({{"ids", json::array()}}));
  // A directory without a chat template answers messages with an error on that line.
  {
    std::ofstream(input) << R"({"messages": [{"role": "user", "content": "hi"}]})"
                         << "\n";
  }
  const auto no_template =
      RunAfdTokenize(DataPath("synthetic/gpt2_ignore_merges"), input, false, &exit_code);
  EXPECT_EQ(exit_code, 1);
  ASSERT_EQ(no_template.size(), 1u);
  EXPECT_NE(no_template[0].value("error", "").find("no chat template"), std::string::npos);
  const CommandResult r = RunCommand(std::string(AFD_BINARY) +
                                     " tokenize --tokenizer /nonexistent < " + input + " 2>&1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("no tokenizer.json"), std::string::npos) << r.out;
}

TEST(server_TokenizeCli, BadTemplateFailsOnlyMessageLines) {
  const std::string dir = ::testing::TempDir() + "/afd_bad_template_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(DataPath("synthetic/gpt2_ignore_merges/tokenizer.json"),
                             dir + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  { std::ofstream(dir + "/chat_template.jinja") << "line 1\n{% for m in messages %}\n"; }
  const std::string input = dir + "/input.jsonl";
  {
    std::ofstream(input) << R"({"text": "hi"})"
                         << "\n"
                         << R"({"messages": [{"role": "user", "content": "hi"}]})"
                         << "\n";
  }
  int exit_code = -1;
  const auto out = RunAfdTokenize(dir, input, false, &exit_code);
  EXPECT_EQ(exit_code, 1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].contains("ids"));
  const std::string error = out[1].value("error", "");
  EXPECT_NE(error.find("does not parse"), std::string::npos) << error;
  EXPECT_NE(error.find("missing {% endfor %}"), std::string::npos) << error;
}

}  // namespace
}  // namespace afd::test

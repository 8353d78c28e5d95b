// Chat templates against Python's Jinja2 set up as transformers does: the DeepSeek-V3 and Qwen3
// templates through `afd tokenize` (prompts, then the prompts' ids against HF's tokenizer), and
// hand-written snippets covering each supported Jinja feature through ChatTemplate directly.
#include <gtest/gtest.h>

#include "afd/common/error.h"
#include "afd/text/chat_template/chat_template.h"
#include "text/reference.h"

namespace afd::test {
namespace {

using json = nlohmann::ordered_json;

void CompareChat(const std::string& dir, const std::vector<std::string>& case_files,
                 const std::string& name) {
  std::vector<json> cases;
  for (const auto& f : case_files) {
    for (auto& c : ReadJsonLines(DataPath(f))) cases.push_back(std::move(c));
  }
  const std::string input = WriteJsonLines(cases, name + "_chat.jsonl");
  int exit_code = -1;
  const std::vector<json> ours = RunAfdTokenize(dir, input, false, &exit_code);
  const std::vector<json> ref = RunJinja(input, dir);
  ASSERT_EQ(ours.size(), cases.size());
  ASSERT_EQ(ref.size(), cases.size());
  std::vector<json> prompts;
  size_t num_ok = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(name + " case " + std::to_string(i) + ": " + cases[i].dump());
    ASSERT_EQ(ours[i].contains("error"), ref[i].contains("error"))
        << "ours: " << ours[i].dump() << "\nref: " << ref[i].dump();
    if (ref[i].contains("error")) continue;
    EXPECT_EQ(ours[i]["prompt"], ref[i]["prompt"]);
    prompts.push_back({{"text", ref[i]["prompt"]}});
    ++num_ok;
  }
  EXPECT_GT(num_ok, cases.size() / 2);
  EXPECT_EQ(exit_code, num_ok == cases.size() ? 0 : 1);
  // The ids of each prompt as HF encodes the reference prompt (no added special tokens).
  const std::string prompt_file = WriteJsonLines(prompts, name + "_prompts.jsonl");
  const std::vector<json> hf = RunHf(dir, prompt_file, false);
  ASSERT_EQ(hf.size(), prompts.size());
  size_t k = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (ref[i].contains("error")) continue;
    EXPECT_EQ(ours[i]["ids"], hf[k]["ids"]) << name << " case " << i;
    ++k;
  }
}

class text_ChatTemplateReference : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string missing = PythonJinjaMissing();
    if (missing.empty()) missing = NodeReferenceMissing();
    if (!missing.empty()) GTEST_SKIP() << "reference unavailable: " << missing;
  }
};

TEST_F(text_ChatTemplateReference, Qwen3) {
  CompareChat(Qwen3Dir(), {"chat_cases.jsonl"}, "qwen3");
}

TEST_F(text_ChatTemplateReference, DeepSeekV3) {
  CompareChat(DeepSeekV3Dir(), {"chat_cases.jsonl", "chat_cases_deepseek.jsonl"}, "deepseek_v3");
}

// A Mistral-style template from chat_template.jinja, which replaces tokenizer_config.json's.
TEST_F(text_ChatTemplateReference, ChatTemplateJinjaFile) {
  CompareChat(DataPath("synthetic/llama_byte_fallback"), {"chat_cases.jsonl"}, "mistral");
}

TEST(text_JinjaSnippets, MatchJinja2) {
  const std::string missing = PythonJinjaMissing();
  if (!missing.empty()) GTEST_SKIP() << "Jinja2 reference unavailable: " << missing;
  const std::string path = DataPath("jinja_snippets.jsonl");
  const std::vector<json> snippets = ReadJsonLines(path);
  const std::vector<json> ref = RunJinja(path);
  ASSERT_EQ(ref.size(), snippets.size());
  size_t num_errors = 0;
  for (size_t i = 0; i < snippets.size(); ++i) {
    SCOPED_TRACE("snippet " + std::to_string(i) + ": " + snippets[i].dump());
    json context = snippets[i];
    const std::string source = context["template"].get<std::string>();
    context.erase("template");
    if (!context.contains("add_generation_prompt")) context["add_generation_prompt"] = false;
    std::string ours, error;
    try {
      ours = text::ChatTemplate(source).Render(context);
    } catch (const Error& e) {
      error = e.what();
    }
    if (ref[i].contains("error")) {
      ++num_errors;
      EXPECT_FALSE(error.empty()) << "Jinja2 failed (" << ref[i]["error"]
                                  << ") but we rendered: " << ours;
    } else {
      EXPECT_TRUE(error.empty()) << error;
      EXPECT_EQ(ours, ref[i]["prompt"].get<std::string>());
    }
  }
  EXPECT_GE(num_errors, 5u);
  EXPECT_LT(num_errors, snippets.size() / 4);
}

}  // namespace
}  // namespace afd::test

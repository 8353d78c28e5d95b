// `afd tokenize` against HF's Rust tokenizer (@anush008/tokenizers) on the test corpus: ids with
// and without special tokens, and decodes of the corpus ids and of random id sequences, for the
// DeepSeek-V3 and Qwen3 tokenizers and every synthetic tokenizer.json.
#include <gtest/gtest.h>

#include <random>

#include "afd/text/tokenizer/tokenizer.h"
#include "text/reference.h"

namespace afd::test {
namespace {

using json = nlohmann::ordered_json;

void ExpectSameLines(const std::vector<json>& input, const std::vector<json>& ours,
                     const std::vector<json>& hf, const std::string& what) {
  ASSERT_EQ(ours.size(), input.size()) << what;
  ASSERT_EQ(hf.size(), input.size()) << what;
  int mismatches = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    EXPECT_EQ(ours[i], hf[i]) << what << " line " << i << ": " << input[i].dump();
    if (ours[i] != hf[i] && ++mismatches >= 5) return;
  }
}

void CompareWithHf(const std::string& dir, const std::string& name) {
  std::vector<json> texts = ReadJsonLines(DataPath("tokenizer_corpus.jsonl"));
  ASSERT_GT(texts.size(), 100u);
  const std::string text_file = WriteJsonLines(texts, name + "_texts.jsonl");
  for (bool special : {false, true}) {
    ExpectSameLines(texts, RunAfdTokenize(dir, text_file, special), RunHf(dir, text_file, special),
                    name + (special ? " encode+special" : " encode"));
  }
  // Decodes: the corpus ids (with special tokens) and random ids, which split characters.
  const auto tokenizer = text::Tokenizer::Load(dir);
  std::vector<json> ids_lines;
  for (const auto& t : texts) {
    ids_lines.push_back({{"ids", tokenizer->Encode(t["text"].get<std::string>(), true)}});
  }
  uint32_t vocab = 0;
  while (tokenizer->IdToToken(vocab)) ++vocab;
  std::mt19937 rng(42);
  for (int i = 0; i < 200; ++i) {
    std::vector<uint32_t> ids(rng() % 24);
    for (auto& id : ids) id = rng() % 3 == 0 ? rng() % 300 : rng() % vocab;
    ids_lines.push_back({{"ids", ids}});
  }
  const std::string ids_file = WriteJsonLines(ids_lines, name + "_ids.jsonl");
  ExpectSameLines(ids_lines, RunAfdTokenize(dir, ids_file, false), RunHf(dir, ids_file, false),
                  name + " decode");
}

class text_TokenizerReference : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string missing = NodeReferenceMissing();
    if (!missing.empty()) GTEST_SKIP() << "HF reference unavailable: " << missing;
  }
};

TEST_F(text_TokenizerReference, DeepSeekV3) { CompareWithHf(DeepSeekV3Dir(), "deepseek_v3"); }

TEST_F(text_TokenizerReference, Qwen3) { CompareWithHf(Qwen3Dir(), "qwen3"); }

TEST_F(text_TokenizerReference, SyntheticTokenizers) {
  const auto dirs = SyntheticDirs();
  ASSERT_GE(dirs.size(), 20u);
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    CompareWithHf(dir, std::filesystem::path(dir).filename().string());
  }
}

}  // namespace
}  // namespace afd::test

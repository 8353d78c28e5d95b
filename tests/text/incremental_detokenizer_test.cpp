// Streaming detokenization: for every corpus entry (and random ids that split characters), the
// pieces are whole UTF-8 characters and add up to the full decode.
#include "afd/text/tokenizer/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "afd/text/tokenizer/utf8.h"
#include "text/reference.h"

namespace afd::text {
namespace {

void CheckStream(const Tokenizer& t, const std::vector<uint32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(t, skip_special);
  std::string all;
  auto check_piece = [&](const std::string& piece) {
    EXPECT_EQ(CompleteUtf8Prefix(piece), piece.size()) << "piece ends inside a character";
    EXPECT_EQ(Utf8Lossy(piece), piece) << "piece is not valid UTF-8";
    all += piece;
  };
  for (uint32_t id : ids) check_piece(detok.Add(id));
  check_piece(detok.Flush());
  EXPECT_EQ(all, t.Decode(ids, skip_special));
}

void CheckTokenizer(const std::string& dir) {
  SCOPED_TRACE(dir);
  const auto t = Tokenizer::Load(dir);
  for (const auto& line : test::ReadJsonLines(test::DataPath("tokenizer_corpus.jsonl"))) {
    const std::vector<uint32_t> ids = t->Encode(line["text"].get<std::string>(), true);
    CheckStream(*t, ids, false);
    CheckStream(*t, ids, true);
  }
  uint32_t vocab = 0;
  while (t->IdToToken(vocab)) ++vocab;
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::vector<uint32_t> ids(rng() % 20);
    for (auto& id : ids) id = rng() % 2 ? rng() % 300 : rng() % vocab;  // low ids: single bytes
    CheckStream(*t, ids, false);
  }
}

TEST(text_IncrementalDetokenizer, RealTokenizers) {
  if (!test::NodeReferenceMissing().empty()) {
    GTEST_SKIP() << "tokenizer data unavailable: " << test::NodeReferenceMissing();
  }
  CheckTokenizer(test::DeepSeekV3Dir());
  CheckTokenizer(test::Qwen3Dir());
}

TEST(text_IncrementalDetokenizer, SyntheticTokenizers) {
  for (const char* name :
       {"llama_byte_fallback", "metaspace_nfkc", "whitespace_nfd", "gpt2_ignore_merges"}) {
    CheckTokenizer(test::DataPath(std::string("synthetic/") + name));
  }
}

TEST(text_IncrementalDetokenizer, HoldsBackSplitCharacters) {
  // GPT-2 byte-level: "é" is two byte tokens when no merge joins them.
  const auto t = Tokenizer::Load(test::DataPath("synthetic/split_isolated_string"));
  const std::vector<uint32_t> ids = t->Encode("\xE4\xBD\xA0", false);  // 你: three bytes
  ASSERT_GE(ids.size(), 2u);
  IncrementalDetokenizer detok(*t, false);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) out += detok.Add(ids[i]);
  EXPECT_EQ(out, "");  // nothing until the character is complete
  out += detok.Add(ids.back());
  EXPECT_EQ(out, "\xE4\xBD\xA0");
  EXPECT_EQ(detok.Flush(), "");
}

}  // namespace
}  // namespace afd::text

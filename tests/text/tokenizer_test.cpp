// Tokenizer loading errors (unsupported components refused by name, bad merges, ids HF would
// reassign) and the UTF-8 helpers' edge cases.
#include "afd/text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "afd/common/error.h"
#include "afd/text/tokenizer/utf8.h"
#include "text/reference.h"

namespace afd::text {
namespace {

using json = nlohmann::json;

json MiniTokenizer() {
  return json::parse(R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<s>": 3}, "merges": ["a b"]},
    "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null})");
}

std::string LoadError(const json& j) {
  try {
    Tokenizer::FromJson(j.dump(), "", "mini");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(text_Tokenizer, MiniEncodeDecode) {
  const auto t = Tokenizer::FromJson(MiniTokenizer().dump(), "", "mini");
  EXPECT_EQ(t->Encode("abab<s>a", false), (std::vector<uint32_t>{2, 2, 3, 0}));
  EXPECT_EQ(t->Decode({2, 3, 0}, false), "ab <s> a");  // no decoder: tokens joined by spaces
  EXPECT_EQ(t->Decode({2, 3, 0}, true), "ab a");
}

TEST(text_Tokenizer, RefusesUnsupportedComponentsByName) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"normalizer", {{"type", "BertNormalizer"}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "SomethingNew"}}},
      {"decoder", {{"type", "WordPiece"}}},
  };
  for (const auto& [field, value] : cases) {
    json j = MiniTokenizer();
    j[field] = value;
    const std::string e = LoadError(j);
    EXPECT_NE(e.find(value["type"].get<std::string>()), std::string::npos) << e;
    EXPECT_NE(e.find(field), std::string::npos) << e;
  }
  json j = MiniTokenizer();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(LoadError(j).find("unsupported model type \"WordPiece\""), std::string::npos);
  j = MiniTokenizer();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(LoadError(j).find("cannot compile regex"), std::string::npos);
  j = MiniTokenizer();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
  EXPECT_NE(LoadError(j).find("unknown split behavior \"Sideways\""), std::string::npos);
}

TEST(text_Tokenizer, RefusesBadMergesAndIds) {
  json j = MiniTokenizer();
  j["model"]["merges"] = {"a c"};
  EXPECT_NE(LoadError(j).find("merges[0]: token \"c\" not in vocab"), std::string::npos)
      << LoadError(j);
  j = MiniTokenizer();
  j["model"]["merges"] = {"b a"};
  EXPECT_NE(LoadError(j).find("merged token \"ba\" not in vocab"), std::string::npos);
  j = MiniTokenizer();
  j["added_tokens"] = {{{"id", 7}, {"content", "<new>"}}};
  EXPECT_NE(LoadError(j).find("would give it id 4"), std::string::npos) << LoadError(j);
  j = MiniTokenizer();
  j["truncation"] = {{"max_length", 8}};
  EXPECT_NE(LoadError(j).find("\"truncation\" is not supported"), std::string::npos);
  try {
    Tokenizer::Load("/nonexistent/dir");
    ADD_FAILURE() << "loaded a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json"), std::string::npos);
  }
}

TEST(text_Utf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(Utf8Lossy("a\xE4\xB8"), "a\xEF\xBF\xBD");            // truncated 3-byte sequence
  EXPECT_EQ(Utf8Lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // two lone continuations
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(CompleteUtf8Prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xFF"), 3u);  // invalid, not incomplete
}

}  // namespace
}  // namespace afd::text

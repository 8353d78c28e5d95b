// The OpenAI HTTP frontend with the DeepSeek-V3 tokenizer and chat template (npm data; skipped
// with a reason when absent): text prompts, streamed text == non-streamed text, stop strings
// across token boundaries, chat, /tokenize and /detokenize.
#include <gtest/gtest.h>

#include <filesystem>

#include "server/api_test_util.h"
#include "text/reference.h"

namespace afd::server::test {
namespace {

class ServerApiTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = afd::test::DeepSeekV3Dir();
    if (!std::filesystem::exists(dir + "/tokenizer.json")) {
      GTEST_SKIP() << "DeepSeek-V3 tokenizer missing (run scripts/setup_tokenizer_data.sh)";
    }
    tokenizer_ = text::Tokenizer::Load(dir);
    chat_template_ = std::make_unique<text::ChatTemplate>(tokenizer_->chat_template());
    EngineModelInfo info;
    info.vocab_size = 129280;
    info.max_model_len = 4096;
    info.eos_token_ids = {1};
    h_ = std::make_unique<ApiHarness>(info, ApiServerOptions{}, tokenizer_.get(),
                                      chat_template_.get());
  }
  // The text of a streamed response, choice 0 (completions or chat).
  static std::string StreamedText(const HttpResult& r, std::string* finish = nullptr) {
    std::string text;
    for (const auto& d : SseData(r.raw)) {
      if (d == "[DONE]") break;
      const json chunk = json::parse(d);
      EXPECT_FALSE(chunk.contains("error")) << d;
      if (chunk["choices"].empty()) continue;
      const json& c = chunk["choices"][0];
      if (c.contains("text")) text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) {
        text += c["delta"]["content"].get<std::string>();
      }
      if (finish && !c["finish_reason"].is_null()) *finish = c["finish_reason"];
    }
    return text;
  }

  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::unique_ptr<text::ChatTemplate> chat_template_;
  std::unique_ptr<ApiHarness> h_;
};

TEST_F(ServerApiTokenizer, TextPromptStreamEqualsNonStream) {
  json req = {{"prompt", "The capital of France is"},
              {"max_tokens", 40},
              {"temperature", 0},
              {"return_token_ids", true},
              {"echo", true}};
  const HttpResult r = h_->Post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& c = r.body["choices"][0];
  std::vector<uint32_t> prompt_ids, ids;
  for (const auto& t : c["prompt_token_ids"]) prompt_ids.push_back(t);
  for (const auto& t : c["token_ids"]) ids.push_back(t);
  EXPECT_EQ(prompt_ids, tokenizer_->Encode("The capital of France is", true));
  const std::string gen = tokenizer_->Decode(ids, true);
  EXPECT_EQ(c["text"], "The capital of France is" + gen);
  req["stream"] = true;
  EXPECT_EQ(StreamedText(h_->Post("/v1/completions", req)), c["text"].get<std::string>());
}

TEST_F(ServerApiTokenizer, StopStringAcrossTokenBoundary) {
  json req = {{"prompt", "Once upon a time"},
              {"max_tokens", 60},
              {"temperature", 0},
              {"return_token_ids", true}};
  const HttpResult full = h_->Post("/v1/completions", req);
  ASSERT_EQ(full.status, 200) << full.raw;
  std::vector<uint32_t> ids;
  for (const auto& t : full.body["choices"][0]["token_ids"]) ids.push_back(t);
  // A stop string made of the end of token 10's text and the start of token 11's.
  const std::string before = tokenizer_->Decode({ids.begin(), ids.begin() + 10}, true);
  const std::string upto = tokenizer_->Decode({ids.begin(), ids.begin() + 11}, true);
  const std::string text = full.body["choices"][0]["text"];
  ASSERT_EQ(text.substr(0, upto.size()), upto);
  ASSERT_GT(upto.size(), before.size() + 0);
  size_t start = before.size() > 0 ? before.size() - 1 : 0;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t end = upto.size() + 1;
  while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  const std::string stop = text.substr(start, end - start);
  const size_t first = text.find(stop);  // the text may hold it earlier
  req["stop"] = json::array({"never-there", stop});
  const HttpResult r = h_->Post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& c = r.body["choices"][0];
  EXPECT_EQ(c["text"], text.substr(0, first));
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["stop_reason"], stop);
  req["stream"] = true;
  std::string finish;
  EXPECT_EQ(StreamedText(h_->Post("/v1/completions", req), &finish), text.substr(0, first));
  EXPECT_EQ(finish, "stop");
  // The engine sequence was aborted once the stop string matched.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (h_->engine.num_live() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(h_->engine.num_live(), 0u);
}

TEST_F(ServerApiTokenizer, ChatThroughTheTemplate) {
  const json messages = json::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello!"}}});
  json req = {{"messages", messages}, {"max_completion_tokens", 12},
              {"temperature", 0},     {"return_token_ids", true},
              {"logprobs", true},     {"top_logprobs", 2}};
  const HttpResult r = h_->Post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r.body["object"], "chat.completion");
  json ctx = {{"messages", messages},
              {"add_generation_prompt", true},
              {"tools", nullptr},
              {"documents", nullptr}};
  for (const auto& [k, v] : tokenizer_->special_tokens_map()) ctx[k] = v;
  const auto want = tokenizer_->Encode(chat_template_->Render(ctx), false);
  std::vector<uint32_t> prompt;
  for (const auto& t : r.body["prompt_token_ids"]) prompt.push_back(t);
  EXPECT_EQ(prompt, want);
  const json& c = r.body["choices"][0];
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["token_ids"].size(), 12u);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 12);
  ASSERT_EQ(c["logprobs"]["content"].size(), 12u);
  const json& lp = c["logprobs"]["content"][0];
  EXPECT_EQ(lp["logprob"], -1.0);
  EXPECT_EQ(lp["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp["bytes"].size(), lp["token"].get<std::string>().size());
  // max_tokens works too; streaming gives the role first, then the same text.
  req.erase("max_completion_tokens");
  req["max_tokens"] = 12;
  req["stream"] = true;
  const HttpResult s = h_->Post("/v1/chat/completions", req);
  const auto data = SseData(s.raw);
  ASSERT_GE(data.size(), 3u);
  const json first = json::parse(data[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(StreamedText(s), c["message"]["content"].get<std::string>());
  // Without either, chat runs to the model length (vLLM's default), unlike completions' 16.
  req.erase("max_tokens");
  req["stream"] = false;
  req["ignore_eos"] = true;
  const HttpResult all = h_->Post("/v1/chat/completions", req);
  ASSERT_EQ(all.status, 200) << all.raw;
  EXPECT_EQ(all.body["usage"]["completion_tokens"].get<int64_t>() +
                all.body["usage"]["prompt_tokens"].get<int64_t>(),
            4096);
}

// include_stop_str_in_output: the text ends just after the stop string (streamed the same).
TEST_F(ServerApiTokenizer, IncludeStopStrInOutputKeepsTheStopString) {
  json req = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}};
  const HttpResult full = h_->Post("/v1/completions", req);
  ASSERT_EQ(full.status, 200) << full.raw;
  const std::string text = full.body["choices"][0]["text"];
  // An ASCII stop string from the middle of the text.
  size_t at = text.size() / 2;
  while (at < text.size() && static_cast<unsigned char>(text[at]) >= 0x80) ++at;
  ASSERT_LT(at + 2, text.size()) << text;
  const std::string stop = text.substr(at, 2);
  ASSERT_EQ(static_cast<unsigned char>(stop[1]) < 0x80, true) << text;
  const size_t first = text.find(stop);
  req["stop"] = stop;
  req["include_stop_str_in_output"] = true;
  const HttpResult r = h_->Post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["text"], text.substr(0, first + stop.size()));
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r.body["choices"][0]["stop_reason"], stop);
  req["stream"] = true;
  EXPECT_EQ(StreamedText(h_->Post("/v1/completions", req)), text.substr(0, first + stop.size()));
  req["stream"] = false;
  req["include_stop_str_in_output"] = false;
  EXPECT_EQ(h_->Post("/v1/completions", req).body["choices"][0]["text"], text.substr(0, first));
}

// add_special_tokens on /v1/completions (default true: the BOS; false: the text's ids alone).
TEST_F(ServerApiTokenizer, AddSpecialTokensFalseLeavesOutTheBos) {
  json req = {{"prompt", "Hello world"}, {"max_tokens", 1}, {"return_token_ids", true}};
  const auto prompt = [&](const json& r) {
    const HttpResult out = h_->Post("/v1/completions", r);
    EXPECT_EQ(out.status, 200) << out.raw;
    std::vector<uint32_t> ids;
    for (const auto& t : out.body["choices"][0]["prompt_token_ids"]) ids.push_back(t);
    return ids;
  };
  EXPECT_EQ(prompt(req), tokenizer_->Encode("Hello world", true));
  req["add_special_tokens"] = false;
  EXPECT_EQ(prompt(req), tokenizer_->Encode("Hello world", false));
  EXPECT_NE(tokenizer_->Encode("Hello world", true), tokenizer_->Encode("Hello world", false));
}

// continue_final_message: the prompt ends with the final (assistant) message, which the model
// continues; with add_generation_prompt also true it is a bad request, as in vLLM.
TEST_F(ServerApiTokenizer, ContinueFinalMessageEndsThePromptWithIt) {
  const json messages = json::array({{{"role", "user"}, {"content", "Count to five."}},
                                     {{"role", "assistant"}, {"content", "One, two,"}}});
  json req = {
      {"messages", messages}, {"continue_final_message", true}, {"add_generation_prompt", false}};
  const HttpResult t = h_->Post("/tokenize", req);
  ASSERT_EQ(t.status, 200) << t.raw;
  std::vector<uint32_t> ids;
  for (const auto& id : t.body["tokens"]) ids.push_back(id);
  const std::string text = tokenizer_->Decode(ids, false);
  EXPECT_GE(text.size(), 9u);
  EXPECT_EQ(text.substr(text.size() - 9), "One, two,") << text;
  EXPECT_NE(text.find("Count to five."), std::string::npos) << text;
  // Rendered whole (no continuation), the assistant turn is closed after it.
  req["continue_final_message"] = false;
  const HttpResult closed = h_->Post("/tokenize", req);
  ASSERT_EQ(closed.status, 200) << closed.raw;
  EXPECT_GT(closed.body["count"].get<int>(), t.body["count"].get<int>());
  req["continue_final_message"] = true;
  req["add_generation_prompt"] = true;
  const HttpResult both = h_->Post("/v1/chat/completions", req);
  EXPECT_EQ(both.status, 400) << both.raw;
  EXPECT_EQ(both.body["error"]["param"], "continue_final_message");
  req.erase("add_generation_prompt");  // its default is true
  EXPECT_EQ(h_->Post("/v1/chat/completions", req).status, 400);
  req["add_generation_prompt"] = false;
  req["max_tokens"] = 3;
  EXPECT_EQ(h_->Post("/v1/chat/completions", req).status, 200);
}

// return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" (completions and chat).
TEST_F(ServerApiTokenizer, ReturnTokensAsTokenIds) {
  json req = {{"prompt", "Hello"},        {"max_tokens", 3},
              {"temperature", 0},         {"logprobs", 1},
              {"return_token_ids", true}, {"return_tokens_as_token_ids", true}};
  const HttpResult r = h_->Post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& c = r.body["choices"][0];
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c["logprobs"]["tokens"][i],
              "token_id:" + std::to_string(c["token_ids"][i].get<int>()));
  }
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 2},
                     {"temperature", 0},
                     {"logprobs", true},
                     {"top_logprobs", 1},
                     {"return_token_ids", true},
                     {"return_tokens_as_token_ids", true}};
  const HttpResult rc = h_->Post("/v1/chat/completions", chat);
  ASSERT_EQ(rc.status, 200) << rc.raw;
  const json& cc = rc.body["choices"][0];
  EXPECT_EQ(cc["logprobs"]["content"][0]["token"],
            "token_id:" + std::to_string(cc["token_ids"][0].get<int>()));
  // Chat's continuous usage: the role chunk (nothing generated yet), then each token's chunk.
  json stream = chat;
  stream["stream"] = true;
  stream["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  const auto data = SseData(h_->Post("/v1/chat/completions", stream).raw);
  ASSERT_EQ(data.size(), 5u);  // role, 2 tokens, usage, [DONE]
  const int64_t prompt_tokens = rc.body["usage"]["prompt_tokens"];
  for (size_t k = 0; k < 3; ++k) {
    const json chunk = json::parse(data[k]);
    EXPECT_EQ(chunk["usage"]["prompt_tokens"], prompt_tokens) << data[k];
    EXPECT_EQ(chunk["usage"]["completion_tokens"], k) << data[k];
  }
  req["return_tokens_as_token_ids"] = false;
  const std::string text =
      h_->Post("/v1/completions", req).body["choices"][0]["logprobs"]["tokens"][0];
  EXPECT_EQ(text.rfind("token_id:", 0), std::string::npos);
}

TEST_F(ServerApiTokenizer, TokenizeAndDetokenize) {
  const HttpResult t =
      h_->Post("/tokenize", json{{"prompt", "Hello world"}, {"return_token_strs", true}});
  ASSERT_EQ(t.status, 200) << t.raw;
  const auto ids = tokenizer_->Encode("Hello world", true);
  EXPECT_EQ(t.body["tokens"], json(ids));
  EXPECT_EQ(t.body["count"], ids.size());
  EXPECT_EQ(t.body["max_model_len"], 4096);
  EXPECT_EQ(t.body["token_strs"].size(), ids.size());
  const HttpResult d = h_->Post("/detokenize", json{{"tokens", t.body["tokens"]}});
  ASSERT_EQ(d.status, 200) << d.raw;
  EXPECT_EQ(d.body["prompt"], tokenizer_->Decode(ids, false));
  const HttpResult chat =
      h_->Post("/tokenize", json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(chat.status, 200) << chat.raw;
  EXPECT_GT(chat.body["count"].get<int>(), 2);
  EXPECT_EQ(h_->Post("/detokenize", json{{"tokens", {129280}}}).status, 400);
}

// A tokenizer whose ids run past the model's vocabulary (a mismatched --tokenizer): the text's
// ids are refused by the engine, and the client gets a 400 naming the id, not a 500.
// A role the template would drop without a word is a bad request naming the message.
TEST_F(ServerApiTokenizer, UnknownChatRoleIsABadRequest) {
  const json chat = {
      {"messages",
       {{{"role", "user"}, {"content", "hello"}}, {{"role", "narrator"}, {"content", "x"}}}},
      {"max_tokens", 4}};
  const HttpResult r = h_->Post("/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["param"], "messages") << r.raw;
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("messages[1].role 'narrator'"),
            std::string::npos)
      << r.raw;
  const json ok = {{"messages",
                    {{{"role", "developer"}, {"content", "be brief"}},
                     {{"role", "user"}, {"content", "hello"}}}},
                   {"max_tokens", 2}};
  EXPECT_EQ(h_->Post("/v1/chat/completions", ok).status, 200);
}

TEST_F(ServerApiTokenizer, IdsPastTheModelsVocabularyAreABadRequest) {
  EngineModelInfo info;
  info.vocab_size = 700;
  info.max_model_len = 4096;
  info.eos_token_ids = {1};
  ApiHarness small(info, ApiServerOptions{}, tokenizer_.get(), chat_template_.get());
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 4}};
  const HttpResult r = small.Post("/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["type"], "BadRequestError") << r.raw;
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("outside the vocabulary [0, 700)"),
            std::string::npos)
      << r.raw;
  json streamed = chat;
  streamed["stream"] = true;
  const HttpResult s = small.Post("/v1/chat/completions", streamed);
  bool saw = false;
  for (const auto& d : SseData(s.raw)) {
    if (d == "[DONE]") break;
    const json chunk = json::parse(d);
    if (!chunk.contains("error")) continue;
    saw = true;
    EXPECT_EQ(chunk["error"]["code"], 400) << d;
  }
  EXPECT_TRUE(saw) << s.raw;
}

// Qwen3's tokenizer and template (the second model family): chat_template_kwargs reach the
// template as variables (enable_thinking: false writes the empty think block), as vLLM passes
// them.
// A request's `documents` reach the chat template (vLLM's RAG field); not a list: 400.
TEST_F(ServerApiTokenizer, DocumentsReachTheTemplate) {
  const text::ChatTemplate rag(
      "{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
      "{% for m in messages %}{{ m.content }}{% endfor %}");
  EngineModelInfo info;
  info.vocab_size = 129280;
  info.max_model_len = 4096;
  info.eos_token_ids = {1};
  ApiHarness h(info, ApiServerOptions{}, tokenizer_.get(), &rag);
  json req = {
      {"messages", {{{"role", "user"}, {"content", "Q?"}}}},
      {"documents", {{{"title", "A"}, {"text", "one"}}, {{"title", "B"}, {"text", "two"}}}}};
  const HttpResult t = h.Post("/tokenize", req);
  ASSERT_EQ(t.status, 200) << t.raw;
  std::vector<uint32_t> ids;
  for (const auto& id : t.body["tokens"]) ids.push_back(id);
  EXPECT_EQ(tokenizer_->Decode(ids, true), "[A: one][B: two]Q?");
  req["documents"] = "A: one";
  req["max_tokens"] = 1;
  const HttpResult bad = h.Post("/v1/chat/completions", req);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["param"], "documents") << bad.raw;
}

TEST(ServerApiQwen3, ChatTemplateKwargsReachTheTemplate) {
  const std::string dir = afd::test::Qwen3Dir();
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3 tokenizer missing (run scripts/setup_tokenizer_data.sh)";
  }
  auto tokenizer = text::Tokenizer::Load(dir);
  auto chat_template = std::make_unique<text::ChatTemplate>(tokenizer->chat_template());
  EngineModelInfo info;
  info.vocab_size = 151936;
  info.max_model_len = 4096;
  info.eos_token_ids = {151645};
  ApiHarness h(info, ApiServerOptions{}, tokenizer.get(), chat_template.get());
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  auto prompt_text = [&](const json& req) {
    const HttpResult r = h.Post("/v1/chat/completions", req);
    EXPECT_EQ(r.status, 200) << r.raw;
    std::vector<uint32_t> ids;
    for (const auto& t : r.body["prompt_token_ids"]) ids.push_back(t);
    return tokenizer->Decode(ids, false);
  };
  json req = {{"messages", messages}, {"max_tokens", 2}, {"return_token_ids", true}};
  const std::string thinking = prompt_text(req);
  EXPECT_EQ(thinking, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  req["chat_template_kwargs"] = {{"enable_thinking", false}};
  EXPECT_EQ(prompt_text(req),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  req["chat_template_kwargs"] = "enable_thinking=false";
  const HttpResult bad = h.Post("/v1/chat/completions", req);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.raw.find("chat_template_kwargs"), std::string::npos) << bad.raw;
}

}  // namespace
}  // namespace afd::server::test

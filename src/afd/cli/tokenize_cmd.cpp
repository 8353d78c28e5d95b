// `afd tokenize`: JSON lines in, JSON lines out (format in docs/tokenizer.md).
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "afd/cli/commands.h"
#include "afd/common/error.h"
#include "afd/text/chat_template/chat_template.h"
#include "afd/text/tokenizer/tokenizer.h"

namespace afd::cli {

namespace {

using json = nlohmann::ordered_json;

// Every id must name a token of `tokenizer` (HF's decode drops an unknown id without a word).
std::vector<uint32_t> IdsField(const json& ids, const text::Tokenizer& tokenizer) {
  AFD_CHECK(ids.is_array(), "\"ids\" must be an array of token ids");
  std::vector<uint32_t> out;
  for (const auto& id : ids) {
    AFD_CHECK(id.is_number_unsigned() && id.get<uint64_t>() <= UINT32_MAX,
              "\"ids\" must hold non-negative integers, got {}", id.dump());
    const uint32_t v = id.get<uint32_t>();
    AFD_CHECK(tokenizer.IdToToken(v).has_value(),
              "\"ids\": {} is not a token of this tokenizer (its ids end at {})", v,
              tokenizer.IdEnd());
    out.push_back(v);
  }
  return out;
}

// Answers one input line; throws afd::Error (or a JSON error) for a bad line.
// The directory's chat template, parsed once; a template that does not parse fails only the
// lines that need it.
struct Template {
  std::unique_ptr<text::ChatTemplate> parsed;
  std::string error;  // why there is none
};

json Answer(const text::Tokenizer& tokenizer, const Template& chat_template,
            const std::string& line, bool add_special_tokens) {
  const json in = json::parse(line);
  AFD_CHECK(in.is_object(), "expected a JSON object");
  if (in.contains("text")) {
    AFD_CHECK(in["text"].is_string(), "\"text\" must be a string");
    return {{"ids", tokenizer.Encode(in["text"].get<std::string>(), add_special_tokens)}};
  }
  if (in.contains("ids")) {
    return {
        {"text", tokenizer.Decode(IdsField(in["ids"], tokenizer), /*skip_special_tokens=*/false)}};
  }
  if (in.contains("messages")) {
    AFD_CHECK(chat_template.parsed != nullptr, "{}", chat_template.error);
    AFD_CHECK(in["messages"].is_array(), "\"messages\" must be an array");
    // Every key of the line is a template variable (messages, tools, add_generation_prompt, and
    // extras such as enable_thinking).
    // As transformers' apply_chat_template: tools and documents are none when not given, and the
    // special tokens map is passed (only the tokens that are set).
    json context = in;
    for (const char* key : {"tools", "documents"}) {
      if (!context.contains(key)) context[key] = nullptr;
    }
    if (!context.contains("add_generation_prompt")) context["add_generation_prompt"] = false;
    for (const auto& [key, value] : tokenizer.special_tokens_map()) {
      if (!context.contains(key)) context[key] = value;
    }
    const std::string prompt = chat_template.parsed->Render(context);
    // As vLLM's chat path: the template already placed the special tokens it wants.
    return {{"prompt", prompt}, {"ids", tokenizer.Encode(prompt, /*add_special_tokens=*/false)}};
  }
  AFD_THROW("expected one of \"text\", \"ids\" or \"messages\"");
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize JSON lines from stdin with a checkpoint's tokenizer: {\"text\": S} -> {\"ids\"}, "
      "{\"ids\": [...]} -> {\"text\"}, {\"messages\": [...], \"add_generation_prompt\": B, "
      "\"tools\": [...]} -> {\"prompt\", \"ids\"}. A bad line gets {\"error\"} and exit status 1.");
  struct Args {
    std::string dir;
    bool add_special_tokens = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--tokenizer", args->dir,
                  "Directory with tokenizer.json (+ tokenizer_config.json)")
      ->required();
  cmd->add_flag("--add-special-tokens", args->add_special_tokens,
                "Apply the post-processor to {\"text\"} lines (e.g. a BOS id in front)");
  cmd->callback([args, &exit_code] {
    const auto tokenizer = text::Tokenizer::Load(args->dir);
    Template chat_template{nullptr, "the tokenizer directory has no chat template"};
    if (!tokenizer->chat_template().empty()) {
      try {
        chat_template.parsed = std::make_unique<text::ChatTemplate>(tokenizer->chat_template());
      } catch (const Error& e) {
        chat_template.error = std::string("the chat template does not parse: ") + e.what();
      }
    }
    std::ios::sync_with_stdio(false);
    exit_code = 0;
    std::string line;
    while (std::getline(std::cin, line)) {
      json out;
      try {
        out = Answer(*tokenizer, chat_template, line, args->add_special_tokens);
      } catch (const std::exception& e) {  // afd::Error or nlohmann::json's parse/type errors
        out = {{"error", e.what()}};
        exit_code = 1;
      }
      std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    std::cout.flush();
  });
}

}  // namespace afd::cli

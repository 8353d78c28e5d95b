#include "afd/text/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "afd/common/error.h"

namespace afd::text {

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AFD_CHECK(in.good(), "{}: cannot open the file", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json ParseJson(const std::string& text, const std::string& name) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    AFD_THROW("{}: invalid JSON: {}", name, e.what());
  }
}

// bos_token / eos_token: a string, an AddedToken object {"content": ...} or null.
std::string TokenField(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
  return "";
}

// chat_template: a string, or a list of {"name", "template"} of which "default" is used.
std::string ChatTemplateField(const nlohmann::json& config, const std::string& name) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return "";
  const auto& v = config["chat_template"];
  if (v.is_string()) return v.get<std::string>();
  AFD_CHECK(v.is_array(), "{}.chat_template: expected a string or a list of named templates", name);
  for (const auto& t : v) {
    if (t.value("name", "") == "default") return t.at("template").get<std::string>();
  }
  AFD_THROW("{}.chat_template: no template named \"default\"", name);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::Load(const std::string& dir) {
  const std::string tok_path = dir + "/tokenizer.json";
  const std::string cfg_path = dir + "/tokenizer_config.json";
  AFD_CHECK(std::filesystem::exists(tok_path), "{}: no tokenizer.json in the directory", dir);
  const std::string config = std::filesystem::exists(cfg_path) ? ReadFile(cfg_path) : std::string();
  std::unique_ptr<Tokenizer> t = FromJson(ReadFile(tok_path), config, dir);
  // Newer checkpoints keep the template in its own file, which transformers prefers.
  const std::string template_path = dir + "/chat_template.jinja";
  if (std::filesystem::exists(template_path)) t->chat_template_ = ReadFile(template_path);
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::FromJson(const std::string& tokenizer_json,
                                               const std::string& tokenizer_config_json,
                                               const std::string& name) {
  const std::string tname = name + "/tokenizer.json";
  const nlohmann::json j = ParseJson(tokenizer_json, tname);
  AFD_CHECK(j.is_object(), "{}: expected a JSON object", tname);
  for (const char* key : {"truncation", "padding"}) {
    AFD_CHECK(!j.contains(key) || j[key].is_null(), "{}: \"{}\" is not supported (must be null)",
              tname, key);
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer);
  AFD_CHECK(j.contains("model") && j["model"].is_object(), "{}: no \"model\" object", tname);
  const std::string model_type = j["model"].value("type", "BPE");
  AFD_CHECK(model_type == "BPE", "{}.model: unsupported model type \"{}\" (only BPE)", tname,
            model_type);
  t->model_ = std::make_unique<BpeModel>(j["model"], tname + ".model");
  t->normalizer_ = MakeNormalizer(j.value("normalizer", nlohmann::json()), tname + ".normalizer");
  t->pre_tokenizer_ =
      MakePreTokenizer(j.value("pre_tokenizer", nlohmann::json()), tname + ".pre_tokenizer");
  t->post_processor_ =
      MakePostProcessor(j.value("post_processor", nlohmann::json()), tname + ".post_processor");
  t->decoder_ = MakeDecoder(j.value("decoder", nlohmann::json()), tname + ".decoder");
  t->byte_fallback_decoder_ =
      j.contains("decoder") && j["decoder"].dump().find("\"ByteFallback\"") != std::string::npos;
  t->added_ = AddedVocabulary(j.value("added_tokens", nlohmann::json()), t->normalizer_.get(),
                              tname + ".added_tokens");
  t->CheckAddedTokenIds(tname + ".added_tokens");

  if (!tokenizer_config_json.empty()) {
    const std::string cname = name + "/tokenizer_config.json";
    const nlohmann::json c = ParseJson(tokenizer_config_json, cname);
    AFD_CHECK(c.is_object(), "{}: expected a JSON object", cname);
    t->chat_template_ = ChatTemplateField(c, cname);
    t->bos_token_ = TokenField(c, "bos_token");
    t->eos_token_ = TokenField(c, "eos_token");
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token"}) {
      const std::string token = TokenField(c, key);
      if (!token.empty()) t->special_tokens_map_.emplace_back(key, token);
    }
    if (c.contains("additional_special_tokens") && c["additional_special_tokens"].is_array()) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& a : c["additional_special_tokens"]) {
        list.push_back(a.is_object() ? a.value("content", "") : a.get<std::string>());
      }
      t->special_tokens_map_.emplace_back("additional_special_tokens", std::move(list));
    }
    // transformers replaces the post-processor by "[bos] $A [eos]" when these flags are set.
    const bool add_bos = c.value("add_bos_token", false) && !t->bos_token_.empty();
    const bool add_eos = c.value("add_eos_token", false) && !t->eos_token_.empty();
    if (add_bos || add_eos) {
      std::vector<uint32_t> prefix, suffix;
      auto id_of = [&](const std::string& token, const char* key) {
        const auto id = t->TokenToId(token);
        AFD_CHECK(id.has_value(), "{}.{}: \"{}\" is not in the vocabulary", cname, key, token);
        return *id;
      };
      if (add_bos) prefix.push_back(id_of(t->bos_token_, "bos_token"));
      if (add_eos) suffix.push_back(id_of(t->eos_token_, "eos_token"));
      t->post_processor_ = MakeBosEosProcessor(std::move(prefix), std::move(suffix));
    }
  }
  return t;
}

void Tokenizer::CheckAddedTokenIds(const std::string& where) const {
  // HF tokenizers ignores the ids in the file: a token of the model's vocab keeps its vocab id,
  // any other gets the next id after the vocab (or after the largest added id above it). A file
  // that disagrees would be tokenized differently by HF, so it is refused.
  std::optional<uint32_t> max_added;
  const auto vocab_size = static_cast<uint32_t>(model_->VocabSize());
  for (size_t i = 0; i < added_.tokens().size(); ++i) {
    const AddedToken& t = added_.tokens()[i];
    uint32_t expected;
    if (const auto id = model_->TokenToId(t.content)) {
      expected = *id;
    } else if (max_added && *max_added >= vocab_size) {
      expected = *max_added + 1;
    } else {
      expected = vocab_size;
    }
    AFD_CHECK(t.id == expected,
              "{}[{}]: token \"{}\" has id {} but HF tokenizers would give it id {} (ids must "
              "follow the model vocab)",
              where, i, t.content, t.id, expected);
    max_added = std::max(max_added.value_or(0), expected);
  }
}

std::vector<uint32_t> Tokenizer::Encode(const std::string& text, bool add_special_tokens) const {
  std::vector<uint32_t> ids;
  std::vector<Piece> pieces;
  for (TextSegment& seg : added_.Split(text)) {
    if (seg.id) {
      ids.push_back(*seg.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({std::move(seg.text), seg.at_start});
    if (pre_tokenizer_) pre_tokenizer_->PreTokenize(&pieces);
    for (const Piece& p : pieces) model_->Tokenize(p.text, &ids);
  }
  if (add_special_tokens && post_processor_) ids = post_processor_->Process(std::move(ids));
  return ids;
}

std::string Tokenizer::Decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    if (const AddedToken* a = added_.FindById(id)) {
      if (!(skip_special_tokens && a->special)) tokens.push_back(a->content);
    } else if (const std::string* s = model_->IdToToken(id)) {
      tokens.push_back(*s);
    }
  }
  if (!decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::string out;
  for (const std::string& piece : decoder_->DecodeChain(std::move(tokens))) out += piece;
  return out;
}

bool Tokenizer::IsPendingByte(uint32_t id) const {
  if (!byte_fallback_decoder_ || added_.FindById(id)) return false;
  const std::string* s = model_->IdToToken(id);
  return s != nullptr && s->size() == 6 && s->compare(0, 3, "<0x") == 0 && (*s)[5] == '>';
}

std::optional<uint32_t> Tokenizer::TokenToId(const std::string& token) const {
  if (auto id = added_.FindByContent(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(uint32_t id) const {
  if (const AddedToken* a = added_.FindById(id)) return a->content;
  if (const std::string* s = model_->IdToToken(id)) return *s;
  return std::nullopt;
}

int64_t Tokenizer::IdEnd() const {
  int64_t end = static_cast<int64_t>(model_->IdEnd());
  for (const AddedToken& t : added_.tokens()) end = std::max<int64_t>(end, int64_t{t.id} + 1);
  return end;
}

}  // namespace afd::text

#include "afd/text/tokenizer/post_processor.h"

#include "afd/common/error.h"

namespace afd::text {

namespace {

// Adds fixed ids around the sequence (Template, Bert, Roberta and bos/eos processing).
class WrapProcessor : public PostProcessor {
 public:
  WrapProcessor(std::vector<uint32_t> prefix, std::vector<uint32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  std::vector<uint32_t> Process(std::vector<uint32_t> ids) const override {
    std::vector<uint32_t> out = prefix_;
    out.insert(out.end(), ids.begin(), ids.end());
    out.insert(out.end(), suffix_.begin(), suffix_.end());
    return out;
  }

 private:
  std::vector<uint32_t> prefix_, suffix_;
};

class IdentityProcessor : public PostProcessor {
 public:
  std::vector<uint32_t> Process(std::vector<uint32_t> ids) const override { return ids; }
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  std::vector<uint32_t> Process(std::vector<uint32_t> ids) const override {
    for (const auto& p : parts_) ids = p->Process(std::move(ids));
    return ids;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

std::unique_ptr<PostProcessor> MakeTemplate(const nlohmann::json& config,
                                            const std::string& where) {
  const auto& single = config.at("single");
  AFD_CHECK(single.is_array(), "{}.single: expected an array", where);
  const auto& specials =
      config.contains("special_tokens") ? config["special_tokens"] : nlohmann::json::object();
  std::vector<uint32_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const auto& piece = single[i];
    if (piece.contains("Sequence")) {
      const std::string id = piece["Sequence"].at("id").get<std::string>();
      AFD_CHECK(id == "A" && !seen_sequence,
                "{}.single[{}]: a single-sequence template holds $A once", where, i);
      seen_sequence = true;
      continue;
    }
    AFD_CHECK(piece.contains("SpecialToken"), "{}.single[{}]: expected Sequence or SpecialToken",
              where, i);
    const std::string name = piece["SpecialToken"].at("id").get<std::string>();
    AFD_CHECK(specials.contains(name), "{}.single[{}]: special token \"{}\" not in special_tokens",
              where, i, name);
    auto& target = seen_sequence ? suffix : prefix;
    for (const auto& id : specials[name].at("ids")) target.push_back(id.get<uint32_t>());
  }
  AFD_CHECK(seen_sequence, "{}.single: the template has no $A", where);
  return std::make_unique<WrapProcessor>(std::move(prefix), std::move(suffix));
}

}  // namespace

std::unique_ptr<PostProcessor> MakeBosEosProcessor(std::vector<uint32_t> prefix,
                                                   std::vector<uint32_t> suffix) {
  return std::make_unique<WrapProcessor>(std::move(prefix), std::move(suffix));
}

std::unique_ptr<PostProcessor> MakePostProcessor(const nlohmann::json& config,
                                                 const std::string& where) {
  if (config.is_null()) return nullptr;
  AFD_CHECK(config.is_object() && config.contains("type"), "{}: expected an object with a type",
            where);
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    const auto& list = config.at("processors");
    for (size_t i = 0; i < list.size(); ++i) {
      parts.push_back(MakePostProcessor(list[i], fmt::format("{}.processors[{}]", where, i)));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<IdentityProcessor>();
  if (type == "TemplateProcessing") return MakeTemplate(config, where);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const uint32_t cls = config.at("cls").at(1).get<uint32_t>();
    const uint32_t sep = config.at("sep").at(1).get<uint32_t>();
    return std::make_unique<WrapProcessor>(std::vector<uint32_t>{cls}, std::vector<uint32_t>{sep});
  }
  AFD_THROW("{}: unsupported post-processor type \"{}\"", where, type);
}

}  // namespace afd::text

// Post-processors of tokenizer.json ("post_processor"), applied to a single sequence's ids when
// special tokens are requested: TemplateProcessing ("single" template with $A and special
// tokens), BertProcessing / RobertaProcessing (cls $A sep), ByteLevel (ids unchanged: it only
// trims offsets) and Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace afd::text {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual std::vector<uint32_t> Process(std::vector<uint32_t> ids) const = 0;
};

// Builds the post-processor described by `config` (null -> nullptr); unsupported types are
// refused by name, `where` names the field.
std::unique_ptr<PostProcessor> MakePostProcessor(const nlohmann::json& config,
                                                 const std::string& where);

// The processor transformers installs for add_bos_token / add_eos_token: [bos] $A [eos].
std::unique_ptr<PostProcessor> MakeBosEosProcessor(std::vector<uint32_t> prefix,
                                                   std::vector<uint32_t> suffix);

}  // namespace afd::text

// Decoders of tokenizer.json ("decoder"): ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
// Sequence. A decoder turns the token strings of a decode into text pieces (HF's decode_chain);
// the decoded text is their concatenation.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace afd::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const = 0;
};

// Builds the decoder described by `config` (null -> nullptr); unsupported types are refused by
// name, `where` names the field.
std::unique_ptr<Decoder> MakeDecoder(const nlohmann::json& config, const std::string& where);

}  // namespace afd::text

// Normalizers of tokenizer.json ("normalizer"): Sequence, NFC, NFD, NFKC, NFKD, Lowercase,
// Replace, Prepend, Strip. They rewrite a segment of input text before pre-tokenization.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace afd::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string Normalize(const std::string& text) const = 0;
};

// Builds the normalizer described by `config` (null -> nullptr). `where` names the field for
// errors; unsupported types are refused by name.
std::unique_ptr<Normalizer> MakeNormalizer(const nlohmann::json& config, const std::string& where);

// A "pattern" object of Replace/Split: {"String": s} or {"Regex": r}. Returns the regex source
// (a String is escaped) .
std::string PatternToRegex(const nlohmann::json& pattern, const std::string& where);

}  // namespace afd::text

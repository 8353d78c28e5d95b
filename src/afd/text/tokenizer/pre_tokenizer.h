// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Sequence, Split (regex or string pattern,
// every behavior, invert), ByteLevel (add_prefix_space, use_regex), Digits, Whitespace,
// WhitespaceSplit, Metaspace (replacement, prepend_scheme always/first/never, split). They cut a
// normalized segment into pieces that the model tokenizes independently.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace afd::text {

struct Piece {
  std::string text;
  bool at_start;  // the piece begins at offset 0 of the whole input (Metaspace's "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenized sub-pieces, in order.
  virtual void PreTokenize(std::vector<Piece>* pieces) const = 0;
};

// Builds the pre-tokenizer described by `config` (null -> nullptr); unsupported types are refused
// by name, `where` names the field.
std::unique_ptr<PreTokenizer> MakePreTokenizer(const nlohmann::json& config,
                                               const std::string& where);

}  // namespace afd::text

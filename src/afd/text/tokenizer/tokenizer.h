// A Hugging Face tokenizer loaded from a checkpoint directory: tokenizer.json (BPE model, added
// tokens, normalizer, pre-tokenizer, post-processor, decoder) and, when present,
// tokenizer_config.json (chat template, bos/eos tokens, add_bos_token/add_eos_token). Encoding and
// decoding reproduce HF tokenizers' ids and text exactly for the supported components (listed in
// docs/tokenizer.md); any other component is refused by name at load.
//
// Thread safety: Encode/Decode may be called from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afd/text/tokenizer/added_vocabulary.h"
#include "afd/text/tokenizer/bpe_model.h"
#include "afd/text/tokenizer/decoder.h"
#include "afd/text/tokenizer/normalizer.h"
#include "afd/text/tokenizer/post_processor.h"
#include "afd/text/tokenizer/pre_tokenizer.h"

namespace afd::text {

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json and, if they exist, `dir`/tokenizer_config.json and
  // `dir`/chat_template.jinja (which replaces tokenizer_config.json's template, as in
  // transformers). Throws afd::Error naming the file and field on any problem.
  static std::unique_ptr<Tokenizer> Load(const std::string& dir);
  // Builds from the JSON texts (tokenizer_config may be empty). `name` prefixes error messages.
  static std::unique_ptr<Tokenizer> FromJson(const std::string& tokenizer_json,
                                             const std::string& tokenizer_config_json,
                                             const std::string& name);

  // The ids of `text`. Added/special tokens in the text are always recognized;
  // add_special_tokens applies the post-processor (e.g. a BOS id in front).
  std::vector<uint32_t> Encode(const std::string& text, bool add_special_tokens) const;

  // The text of `ids` (ids unknown to the vocab are skipped, as HF does). Always valid UTF-8.
  std::string Decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const;

  // True when `id` is a byte-fallback token (<0xXX>) and the decoder has ByteFallback: the text
  // of a run of such tokens depends on the tokens after it (an invalid run becomes U+FFFDs).
  bool IsPendingByte(uint32_t id) const;

  std::optional<uint32_t> TokenToId(const std::string& token) const;
  // One past the largest id of the vocab and the added tokens: the smallest vocabulary a model
  // must have for every id this tokenizer produces.
  int64_t IdEnd() const;
  std::optional<std::string> IdToToken(uint32_t id) const;

  // From tokenizer_config.json; empty when absent.
  const std::string& chat_template() const { return chat_template_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // transformers' special_tokens_map: bos/eos/unk/sep/pad/cls/mask_token (those that are set) and
  // additional_special_tokens, as chat templates see them.
  const std::vector<std::pair<std::string, nlohmann::json>>& special_tokens_map() const {
    return special_tokens_map_;
  }

 private:
  Tokenizer() = default;
  void CheckAddedTokenIds(const std::string& where) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  bool byte_fallback_decoder_ = false;
  AddedVocabulary added_;
  std::string chat_template_;
  std::string bos_token_;
  std::string eos_token_;
  std::vector<std::pair<std::string, nlohmann::json>> special_tokens_map_;
};

}  // namespace afd::text

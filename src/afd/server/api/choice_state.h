// One choice of a request (one engine sequence) as the client sees it: the engine's outputs
// turned into deltas of text, token ids and logprobs, and its finish (reason, vLLM's
// stop_reason, or an error).
//
// Finish mapping: engine kStop/kLength -> "stop"/"length"; a stop string -> "stop" with
// stop_reason the string (the engine sequence must then be aborted: needs_abort()); a stop
// token from stop_token_ids -> stop_reason that id (EOS: null); the text of an EOS or stop token
// is not in the output, its id is. kError, or a kAbort the server did not ask for, -> error().
//
// Thread safety: one instance per choice; not thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "afd/runtime/request.h"
#include "afd/server/api/choice_text.h"
#include "afd/server/api/sampling_request.h"

namespace afd::server::api {

struct ChoiceDelta {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<runtime::TokenLogprobs> logprobs;         // parallel to token_ids when requested
  std::vector<runtime::TokenLogprobs> prompt_logprobs;  // once, when the engine sends them
  bool finished = false;
};

class ChoiceState {
 public:
  ChoiceState(const text::Tokenizer* tokenizer, const SamplingRequest& request,
              const EngineModelInfo& info);

  // Applies one engine output; nullopt when it adds nothing for the client (outputs after the
  // choice finished, e.g. the abort that follows a stop string).
  std::optional<ChoiceDelta> Apply(const runtime::RequestOutput& output);
  // Ends the choice with an error (the engine failed, or the server gave up on it).
  void Fail(const std::string& why);

  bool done() const { return done_; }
  bool needs_abort() const {
    return needs_abort_;
  }  // a stop string matched before the engine ended
  const std::string& error() const { return error_; }  // non-empty: failed
  // Failed because the engine refused the request's input (RequestOutput::rejected).
  bool rejected() const { return rejected_; }
  const std::string& finish_reason() const { return finish_reason_; }
  const nlohmann::ordered_json& stop_reason() const { return stop_reason_; }
  const std::string& text() const { return text_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  const std::vector<runtime::TokenLogprobs>& logprobs() const { return logprobs_; }
  const std::vector<runtime::TokenLogprobs>& prompt_logprobs() const { return prompt_logprobs_; }
  // The engine held the choice's KV rows when it finished (the prefill leg of a transfer).
  bool kv_held() const { return kv_held_; }
  int64_t kv_positions() const { return kv_positions_; }
  const std::vector<int32_t>& kv_block_ids() const { return kv_block_ids_; }

 private:
  bool want_logprobs_;
  std::vector<int32_t> stop_token_ids_;
  std::vector<int32_t> eos_token_ids_;
  bool ignore_eos_;
  ChoiceText text_state_;
  bool done_ = false;
  bool needs_abort_ = false;
  std::string error_;
  bool rejected_ = false;
  std::string finish_reason_;
  nlohmann::ordered_json stop_reason_;  // null, a stop string or a stop token id
  std::string text_;
  std::vector<int32_t> token_ids_;
  std::vector<runtime::TokenLogprobs> logprobs_;
  std::vector<runtime::TokenLogprobs> prompt_logprobs_;
  bool kv_held_ = false;
  int64_t kv_positions_ = 0;
  std::vector<int32_t> kv_block_ids_;
};

}  // namespace afd::server::api

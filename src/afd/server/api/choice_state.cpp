#include "afd/server/api/choice_state.h"

#include <algorithm>

namespace afd::server::api {

namespace {

bool Contains(const std::vector<int32_t>& v, int32_t id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

}  // namespace

ChoiceState::ChoiceState(const text::Tokenizer* tokenizer, const SamplingRequest& request,
                         const EngineModelInfo& info)
    : want_logprobs_(request.logprobs >= 0),
      stop_token_ids_(request.stop_token_ids),
      eos_token_ids_(info.eos_token_ids),
      ignore_eos_(request.ignore_eos),
      text_state_(tokenizer, request.stop, request.skip_special_tokens,
                  request.include_stop_str_in_output) {}

void ChoiceState::Fail(const std::string& why) {
  if (done_) return;
  done_ = true;
  error_ = why.empty() ? std::string("the engine failed without a reason") : why;
}

std::optional<ChoiceDelta> ChoiceState::Apply(const runtime::RequestOutput& output) {
  if (done_) return std::nullopt;
  ChoiceDelta delta;
  if (!output.prompt_logprobs.empty()) {
    prompt_logprobs_ = output.prompt_logprobs;
    delta.prompt_logprobs = output.prompt_logprobs;
  }
  if (output.finish_reason == runtime::FinishReason::kError) {
    Fail(output.error);
    rejected_ = output.rejected;
    return std::nullopt;
  }
  if (output.finish_reason == runtime::FinishReason::kAbort) {
    Fail("the request was aborted by the engine" +
         (output.error.empty() ? std::string() : ": " + output.error));
    return std::nullopt;
  }
  const bool stop_token_end = output.finished &&
                              output.finish_reason == runtime::FinishReason::kStop &&
                              output.stop_token_id >= 0 && !output.token_ids.empty() &&
                              output.token_ids.back() == output.stop_token_id;
  for (size_t i = 0; i < output.token_ids.size(); ++i) {
    const int32_t id = output.token_ids[i];
    token_ids_.push_back(id);
    delta.token_ids.push_back(id);
    if (want_logprobs_ && i < output.logprobs.size()) {
      logprobs_.push_back(output.logprobs[i]);
      delta.logprobs.push_back(output.logprobs[i]);
    }
    if (stop_token_end && i + 1 == output.token_ids.size()) break;  // its text is not output
    delta.text += text_state_.Add(id);
    if (text_state_.stopped()) {
      done_ = true;
      needs_abort_ = !output.finished;
      finish_reason_ = "stop";
      stop_reason_ = text_state_.stop_string();
      break;
    }
  }
  if (output.finished && output.kv_held) {
    kv_held_ = true;
    kv_positions_ = output.kv_positions;
    kv_block_ids_ = output.kv_block_ids;
  }
  if (!done_ && output.finished) {
    delta.text += text_state_.Finish();
    done_ = true;
    if (text_state_.stopped()) {
      finish_reason_ = "stop";
      stop_reason_ = text_state_.stop_string();
    } else {
      finish_reason_ = output.finish_reason == runtime::FinishReason::kLength ? "length" : "stop";
      // vLLM: stop_reason is the stop token id, unless the token ended it as EOS.
      const int32_t stop_id = output.stop_token_id;
      const bool is_eos = !ignore_eos_ && Contains(eos_token_ids_, stop_id);
      if (output.finish_reason == runtime::FinishReason::kStop && stop_id >= 0 && !is_eos &&
          Contains(stop_token_ids_, stop_id)) {
        stop_reason_ = stop_id;
      }
    }
  }
  delta.finished = done_;
  text_ += delta.text;
  return delta;
}

}  // namespace afd::server::api

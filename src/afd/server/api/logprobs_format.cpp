#include "afd/server/api/logprobs_format.h"

#include <cmath>

namespace afd::server::api {

namespace {

double Finite(float logprob) {
  if (std::isnan(logprob)) return -9999.0;
  return std::isinf(logprob) ? -9999.0 : static_cast<double>(logprob);
}

// Length in characters (code points), as Python's len() of the token string.
int64_t NumChars(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace

std::string TokenString(const text::Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return "token_id:" + std::to_string(id);
  return tokenizer->Decode({static_cast<uint32_t>(id)}, /*skip_special_tokens=*/false);
}

json CompletionLogprobs(const text::Tokenizer* tokenizer, const std::vector<int32_t>& ids,
                        const std::vector<const runtime::TokenLogprobs*>& logprobs,
                        int64_t* text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string token = TokenString(tokenizer, ids[i]);
    tokens.push_back(token);
    offsets.push_back(*text_offset);
    *text_offset += NumChars(token);
    const runtime::TokenLogprobs* lp = i < logprobs.size() ? logprobs[i] : nullptr;
    if (lp == nullptr) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(Finite(lp->logprob));
    // The k most likely tokens, plus the chosen one (vLLM gives k or k + 1 entries).
    json entries = json::object();
    for (const auto& t : lp->top) {
      const std::string s = TokenString(tokenizer, t.id);
      if (!entries.contains(s)) entries[s] = Finite(t.logprob);
    }
    if (!entries.contains(token)) entries[token] = Finite(lp->logprob);
    top.push_back(std::move(entries));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

void AppendCompletionLogprobs(json& into, const json& more) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const auto& v : more[key]) into[key].push_back(v);
  }
}

json ChatLogprobsContent(const text::Tokenizer* tokenizer, const std::vector<int32_t>& ids,
                         const std::vector<runtime::TokenLogprobs>& logprobs, int32_t num_top) {
  json content = json::array();
  for (size_t i = 0; i < ids.size() && i < logprobs.size(); ++i) {
    const std::string token = TokenString(tokenizer, ids[i]);
    json top = json::array();
    for (int32_t k = 0; k < num_top && k < static_cast<int32_t>(logprobs[i].top.size()); ++k) {
      const auto& t = logprobs[i].top[k];
      const std::string s = TokenString(tokenizer, t.id);
      top.push_back({{"token", s}, {"logprob", Finite(t.logprob)}, {"bytes", Bytes(s)}});
    }
    content.push_back({{"token", token},
                       {"logprob", Finite(logprobs[i].logprob)},
                       {"bytes", Bytes(token)},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

}  // namespace afd::server::api

#include "afd/deploy/rank_output.h"

#include <fmt/format.h>

#include <fstream>

#include "afd/common/error.h"
#include "afd/deploy/result_json.h"

namespace afd::deploy {

PromptShare ShareOfPrompts(const std::vector<std::vector<int32_t>>& all, int replicas,
                           int replica) {
  PromptShare share;
  for (size_t i = 0; i < all.size(); ++i) {
    if (static_cast<int>(i % replicas) == replica) {
      share.prompts.push_back(all[i]);
      share.indices.push_back(static_cast<int64_t>(i));
    }
  }
  return share;
}

void WriteFileOrThrow(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  AFD_CHECK(out.good(), "cannot write {}", path);
}

std::string ResultLines(const std::vector<int64_t>& indices,
                        const std::vector<runtime::GenerationResult>& results) {
  std::string text;
  for (size_t i = 0; i < results.size(); ++i) {
    text +=
        fmt::format("{{\"index\": {}, \"result\": {}}}\n", indices[i], ResultJsonLine(results[i]));
  }
  return text;
}

void AddGenerationStats(const runtime::GenerationStats& s, nlohmann::json& out) {
  out["prefill_tokens"] = s.prefill_tokens;
  out["prefill_seconds"] = s.prefill_seconds;
  out["decode_tokens"] = s.decode_tokens;
  out["decode_steps"] = s.decode_steps;
  out["decode_seconds"] = s.decode_seconds;
  out["steady_decode_tokens"] = s.steady_decode_tokens;
  out["steady_decode_steps"] = s.steady_decode_steps;
  out["steady_decode_seconds"] = s.steady_decode_seconds;
  out["mixed_steps"] = s.mixed_steps;
  out["mixed_seconds"] = s.mixed_seconds;
}

}  // namespace afd::deploy

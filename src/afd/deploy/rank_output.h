// What a rank that generates for its share of `afd run`'s prompts writes for the launcher (the
// attention ranks of AFD, the ranks of a data-parallel + expert-parallel deployment):
// out<r>.jsonl lines {"index": i, "result": <ResultJsonLine>} and a stats JSON object, which
// RunDeployment (deployment_run.h) merges.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afd/runtime/engine.h"
#include "afd/runtime/generator.h"

namespace afd::deploy {

// Replica `replica` of `replicas` takes prompts i with i % replicas == replica.
struct PromptShare {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> indices;  // their indices among all prompts (also their sampler streams)
};
PromptShare ShareOfPrompts(const std::vector<std::vector<int32_t>>& all, int replicas, int replica);

// Writes `text` to `path` (truncating); throws afd::Error naming the path when it cannot.
void WriteFileOrThrow(const std::string& path, const std::string& text);

// The out<r>.jsonl lines of `results` (results[i] is prompt indices[i]).
std::string ResultLines(const std::vector<int64_t>& indices,
                        const std::vector<runtime::GenerationResult>& results);

// The engine counters of a rank's stats: prefill/decode/mixed tokens, steps and seconds.
void AddGenerationStats(const runtime::GenerationStats& stats, nlohmann::json& out);

}  // namespace afd::deploy

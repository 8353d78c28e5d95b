// The prompts `afd bench serve` sends: vLLM's "random" dataset (seeded random token ids of
// random lengths) or a JSONL file of prompts. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace afd::bench_client {

struct BenchPrompt {
  std::vector<int64_t> ids;  // the prompt as token ids (sent as an id array), or
  std::string text;          // as text, when is_text
  bool is_text = false;
  int64_t output_len = 0;  // max_tokens of its request (>= 1)
};

struct RandomDatasetOptions {
  int64_t num_prompts = 0;
  int64_t input_len = 0;  // lengths are drawn from [floor(len(1-r)), ceil(len(1+r))]
  int64_t output_len = 0;
  double range_ratio = 0.0;  // r in [0, 1)
  int64_t vocab_size = 0;    // ids are drawn uniformly from [0, vocab_size)
  uint64_t seed = 0;
};

// The same prompts for the same options, on every machine (mt19937_64 draws, no
// platform-defined distributions). Input lengths are at least 1, output lengths at least 1.
std::vector<BenchPrompt> RandomDataset(const RandomDatasetOptions& options);

// One JSON object per non-blank line: "prompt" (a string or an array of token ids) and
// optionally "output_len" or "max_tokens" (else `default_output_len`). The first `num_prompts`
// prompts are used, cycling when the file has fewer. Throws afd::Error naming the file and line.
std::vector<BenchPrompt> LoadJsonlDataset(const std::string& path, int64_t num_prompts,
                                          int64_t default_output_len);

}  // namespace afd::bench_client

// Generation on one DeepseekModel: batched prefill of all prompts in one forward step, then
// incremental decode of every unfinished sequence together, one token per step, over the MLA
// cache. Stops a sequence at max_tokens or after it emits EOS (unless ignore_eos).
// Log-probabilities are those of the model's distribution (log_softmax of the raw logits),
// whatever the sampling parameters.
// Thread safety: one Generate at a time per Generator.
#pragma once

#include <cstdint>
#include <vector>

#include "afd/model/model.h"
#include "afd/runtime/sampler.h"

namespace afd::runtime {

struct GenerationOptions {
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  SamplingParams sampling;
  bool keep_prompt_logits = false;  // fill GenerationResult::prompt_logits
};

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;   // EOS included when it stopped the sequence
  std::vector<float> prompt_logprobs;  // [T]; [0] is NaN (no prefix), [j] = log p(ids[j] | ids[<j])
  std::vector<float> logprobs;       // one per output token
  std::vector<float> prompt_logits;  // [T, vocab] when keep_prompt_logits
};

struct GenerationStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  int64_t decode_tokens = 0;  // tokens fed through decode steps
  int64_t decode_steps = 0;
  double decode_seconds = 0.0;
};

class Generator {
 public:
  // `model` and `moe` must outlive the generator.
  Generator(const model::DeepseekModel& model, model::MoeBackend& moe) : model_(model), moe_(moe) {}

  // Throws afd::Error for an empty prompt, ids outside the vocabulary, bad sampling parameters,
  // or prompt + max_tokens beyond max_position_embeddings.
  std::vector<GenerationResult> Generate(const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options,
                                         GenerationStats* stats = nullptr);

 private:
  const model::DeepseekModel& model_;
  model::MoeBackend& moe_;
};

}  // namespace afd::runtime

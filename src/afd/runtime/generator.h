// Generation on one DeepseekModel with continuous batching over the MLA cache: each step
// decodes one token of every running sequence and prefills the prompts admitted in that step
// (all at the first step, unless max_num_seqs or max_num_batched_tokens limit a step: then a
// waiting prompt is admitted as soon as it fits, and steps mix prefill and decode tokens).
// Stops a sequence at max_tokens or after it emits EOS (unless ignore_eos). Every token is
// computed alone, so results do not depend on how sequences were batched.
// Log-probabilities are those of the model's distribution (log_softmax of the raw logits),
// whatever the sampling parameters.
// Thread safety: one Generate at a time per Generator.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "afd/model/model.h"
#include "afd/runtime/sampler.h"

namespace afd::runtime {

struct GenerationOptions {
  // Sampler stream of each prompt (seeds its RNG with the sampling seed); empty: the prompt's
  // index. A data-parallel replica passes the prompts' global indices so that sampling matches
  // a run of all prompts in one process.
  std::vector<int64_t> sampler_streams;
  int64_t max_tokens = 16;
  int64_t max_num_seqs = 0;  // running sequences at most; 0: no limit
  // Tokens per step at most (decode tokens plus admitted prompts); 0: no limit. A prompt that
  // does not fit waits, unless nothing else would run (then it runs alone, whatever its size).
  int64_t max_num_batched_tokens = 0;
  bool ignore_eos = false;
  SamplingParams sampling;
  bool keep_prompt_logits = false;  // fill GenerationResult::prompt_logits
};

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;     // EOS included when it stopped the sequence
  std::vector<float> prompt_logprobs;  // [T]; [0] is NaN (no prefix), [j] = log p(ids[j] | ids[<j])
  std::vector<float> logprobs;         // one per output token
  std::vector<float> prompt_logits;    // [T, vocab] when keep_prompt_logits
};

struct GenerationStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  int64_t decode_tokens = 0;  // tokens fed through decode-only steps
  int64_t decode_steps = 0;
  double decode_seconds = 0.0;
  // Steps with both prefill and decode tokens (continuous batching): their tokens and time.
  int64_t mixed_steps = 0;
  int64_t mixed_prefill_tokens = 0;
  int64_t mixed_decode_tokens = 0;
  double mixed_seconds = 0.0;
};

// Runs one forward step: logits [n, vocab] for the batch's tokens, appending them to the cache.
// In process (LocalStepRunner) or as the AFD attention role with the MoE layers elsewhere.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual void Forward(const model::ForwardBatch& batch, model::MlaKvCache& cache,
                       float* logits) = 0;
};

class LocalStepRunner : public StepRunner {
 public:
  LocalStepRunner(const model::DeepseekModel& model, model::MoeBackend& moe)
      : model_(model), moe_(moe) {}
  void Forward(const model::ForwardBatch& batch, model::MlaKvCache& cache, float* logits) override {
    model_.Forward(batch, cache, moe_, logits);
  }

 private:
  const model::DeepseekModel& model_;
  model::MoeBackend& moe_;
};

class Generator {
 public:
  // `model` and `moe` must outlive the generator.
  Generator(const model::DeepseekModel& model, model::MoeBackend& moe)
      : model_(model), local_(std::make_unique<LocalStepRunner>(model, moe)), runner_(*local_) {}
  // Steps run through `runner`, which must outlive the generator.
  Generator(const model::DeepseekModel& model, StepRunner& runner)
      : model_(model), runner_(runner) {}

  // Throws afd::Error for an empty prompt, ids outside the vocabulary, bad sampling parameters,
  // or prompt + max_tokens beyond max_position_embeddings.
  std::vector<GenerationResult> Generate(const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options,
                                         GenerationStats* stats = nullptr);

 private:
  const model::DeepseekModel& model_;
  std::unique_ptr<LocalStepRunner> local_;  // set by the first constructor only
  StepRunner& runner_;
};

}  // namespace afd::runtime

// Generation on one DeepseekModel with continuous batching over the paged latent cache
// (runtime/scheduler.h): each step decodes one token of every running sequence and prefills the
// prompts admitted in that step. Stops a sequence at max_tokens or after it emits EOS (unless
// ignore_eos). Every token is computed alone, so results do not depend on how sequences were
// batched or whether one was preempted and recomputed.
// Log-probabilities are those of the model's distribution (log_softmax of the raw logits),
// whatever the sampling parameters. Sampling runs on the backend (Sample op) with each
// sequence's host random stream.
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
  bool prompt_logprobs = false;     // fill GenerationResult::prompt_logprobs
  bool keep_prompt_logits = false;  // fill GenerationResult::prompt_logits (implies the above)
  // KV cache blocks (of kv::kDefaultBlockSize tokens); 0: enough for every prompt at full
  // length at once (never preempts).
  int64_t num_kv_blocks = 0;
};

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;     // EOS included when it stopped the sequence
  std::vector<float> prompt_logprobs;  // [T] when asked; [0] is NaN, [j] = log p(ids[j] | ids[<j])
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
  int64_t preemptions = 0;     // sequences preempted (and recomputed) for lack of KV blocks
  int64_t kv_blocks = 0;       // blocks of the cache
  int64_t peak_kv_blocks = 0;  // most blocks in use at once
};

// Runs one forward step: logits [m, vocab] (in ws) for the batch's logits rows, appending its
// tokens to the cache. In process (LocalStepRunner) or as the AFD attention role with the MoE
// layers elsewhere.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                         Workspace& ws) = 0;
};

class LocalStepRunner : public StepRunner {
 public:
  // `model` must outlive the runner; it must hold every expert.
  explicit LocalStepRunner(const model::DeepseekModel& model) : model_(model), moe_(model) {}
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                 Workspace& ws) override {
    return model_.Forward(batch, cache, moe_, ws);
  }

 private:
  const model::DeepseekModel& model_;
  model::LocalMoeBackend moe_;
};

class Generator {
 public:
  // In process. `model` must outlive the generator.
  explicit Generator(const model::DeepseekModel& model);
  // Steps run through `runner`, which must outlive the generator.
  Generator(const model::DeepseekModel& model, StepRunner& runner);

  // Throws afd::Error for an empty prompt, ids outside the vocabulary, bad sampling parameters,
  // or prompt + max_tokens beyond max_position_embeddings.
  std::vector<GenerationResult> Generate(const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options,
                                         GenerationStats* stats = nullptr);

 private:
  const model::DeepseekModel& model_;
  std::unique_ptr<LocalStepRunner> local_;  // set by the first constructor only
  StepRunner& runner_;
  Workspace ws_;
};

}  // namespace afd::runtime

// Generation of a fixed set of prompts on one MoeModel: every prompt is queued at once on
// a serving engine (runtime/engine.h: continuous batching over the paged latent cache) that
// steps until all are done. Stops a sequence at max_tokens or after it emits EOS (unless
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
#include "afd/runtime/engine.h"
#include "afd/runtime/sampler.h"
#include "afd/runtime/step_runner.h"

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
  bool chunked_prefill = false;                               // needs max_num_batched_tokens > 0
  AsyncScheduling async_scheduling = AsyncScheduling::kAuto;  // EngineOptions'
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
  // [T] with prompt_logprobs: [0] is -1, [j] = the most likely token after ids[<j] (the top-1
  // agreement of the fidelity method (tools/fidelity.py), scored over teacher-forced sequences; the
  // step's greedy ids, so no logits row is copied to the host for it)
  std::vector<int32_t> prompt_top1;
  std::vector<float> logprobs;       // one per output token
  std::vector<float> prompt_logits;  // [T, vocab] when keep_prompt_logits
};

class Generator {
 public:
  // In process. `model` must outlive the generator.
  explicit Generator(const model::MoeModel& model);
  // Steps run through `runner`, which must outlive the generator.
  Generator(const model::MoeModel& model, StepRunner& runner);

  // Throws afd::Error for an empty prompt, ids outside the vocabulary, bad sampling parameters,
  // or prompt + max_tokens beyond max_position_embeddings.
  std::vector<GenerationResult> Generate(const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options,
                                         GenerationStats* stats = nullptr);

 private:
  const model::MoeModel& model_;
  std::unique_ptr<LocalStepRunner> local_;  // set by the first constructor only
  StepRunner& runner_;
};

}  // namespace afd::runtime

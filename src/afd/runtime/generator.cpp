#include "afd/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "afd/common/error.h"

namespace afd::runtime {

namespace {

void Validate(const model::ModelConfig& c, const std::vector<std::vector<int32_t>>& prompts,
              const GenerationOptions& o) {
  ValidateSamplingParams(o.sampling);
  AFD_CHECK(o.max_tokens >= 0, "max_tokens must be >= 0, got {}", o.max_tokens);
  AFD_CHECK(o.num_kv_blocks >= 0, "num_kv_blocks must be >= 0, got {}", o.num_kv_blocks);
  AFD_CHECK(o.sampler_streams.empty() || o.sampler_streams.size() == prompts.size(),
            "{} sampler streams for {} prompts", o.sampler_streams.size(), prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    AFD_CHECK(!prompts[s].empty(), "prompt {} is empty", s);
    for (int32_t id : prompts[s]) {
      AFD_CHECK(id >= 0 && id < c.vocab_size,
                "prompt {}: token id {} is outside the vocabulary [0, {})", s, id, c.vocab_size);
    }
    const int64_t total = static_cast<int64_t>(prompts[s].size()) + o.max_tokens;
    AFD_CHECK(total <= c.max_position_embeddings,
              "prompt {}: {} prompt tokens + {} new tokens exceed max_position_embeddings {}", s,
              prompts[s].size(), o.max_tokens, c.max_position_embeddings);
  }
}

}  // namespace

Generator::Generator(const model::MoeModel& model)
    : model_(model), local_(std::make_unique<LocalStepRunner>(model)), runner_(*local_) {}

Generator::Generator(const model::MoeModel& model, StepRunner& runner)
    : model_(model), runner_(runner) {}

std::vector<GenerationResult> Generator::Generate(const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerationOptions& options,
                                                  GenerationStats* stats) {
  const model::ModelConfig& c = model_.config();
  Validate(c, prompts, options);
  const bool want_prompt_logprobs = options.prompt_logprobs || options.keep_prompt_logits;
  EngineOptions eo;
  eo.max_num_seqs = options.max_num_seqs;
  eo.max_num_batched_tokens = options.max_num_batched_tokens;
  eo.chunked_prefill = options.chunked_prefill;
  eo.async_scheduling = options.async_scheduling;
  eo.num_kv_blocks = options.num_kv_blocks;
  if (eo.num_kv_blocks == 0) {
    // Enough for every prompt at full length at once: never preempts.
    const kv::CacheShape shape = model_.CacheShape(1);
    for (const auto& p : prompts) {
      eo.num_kv_blocks += shape.BlocksFor(static_cast<int64_t>(p.size()) + options.max_tokens + 1);
    }
    eo.num_kv_blocks = std::max<int64_t>(eo.num_kv_blocks, 1);
  }
  Engine engine(model_, runner_, eo);
  std::vector<GenerationResult> results(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    results[s].prompt_ids = prompts[s];
    RequestParams p;
    p.prompt = prompts[s];
    p.max_tokens = options.max_tokens;
    p.sampling = options.sampling;
    p.sampler_stream =
        options.sampler_streams.empty() ? static_cast<int64_t>(s) : options.sampler_streams[s];
    p.ignore_eos = options.ignore_eos;
    p.logprobs = 0;
    p.prompt_logprobs = want_prompt_logprobs ? 0 : -1;
    p.keep_prompt_logits = options.keep_prompt_logits;
    engine.Add(s, std::move(p));
  }
  while (engine.HasWork()) {
    for (RequestOutput& o : engine.Step()) {
      AFD_CHECK(o.finish_reason != FinishReason::kError, "prompt {}: {}", o.request_id, o.error);
      GenerationResult& r = results[o.request_id];
      for (const TokenLogprobs& t : o.prompt_logprobs) {
        r.prompt_logprobs.push_back(t.logprob);
        r.prompt_top1.push_back(t.argmax);
      }
      if (!o.prompt_logits.empty()) r.prompt_logits = std::move(o.prompt_logits);
      for (size_t i = 0; i < o.token_ids.size(); ++i) {
        r.output_ids.push_back(o.token_ids[i]);
        r.logprobs.push_back(o.logprobs[i].logprob);
      }
    }
  }
  if (stats) *stats = engine.generation_stats();
  return results;
}

}  // namespace afd::runtime

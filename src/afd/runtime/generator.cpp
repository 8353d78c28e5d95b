#include "afd/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "afd/common/error.h"
#include "afd/kernels/cpu/ops.h"

namespace afd::runtime {

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

float LogProb(const float* logits, int64_t vocab, int32_t id, std::vector<float>& scratch) {
  scratch.resize(vocab);
  kernels::LogSoftmax(logits, vocab, scratch.data());
  return scratch[id];
}

}  // namespace

std::vector<GenerationResult> Generator::Generate(const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerationOptions& options,
                                                  GenerationStats* stats) {
  const model::ModelConfig& c = model_.config();
  const int64_t vocab = c.vocab_size;
  ValidateSamplingParams(options.sampling);
  AFD_CHECK(options.max_tokens >= 0, "max_tokens must be >= 0, got {}", options.max_tokens);
  model::MlaKvCache cache = model_.NewCache();
  model::ForwardBatch prefill;
  std::vector<GenerationResult> results(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto& prompt = prompts[s];
    AFD_CHECK(!prompt.empty(), "prompt {} is empty", s);
    for (int32_t id : prompt) {
      AFD_CHECK(id >= 0 && id < vocab, "prompt {}: token id {} is outside the vocabulary [0, {})",
                s, id, vocab);
    }
    const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
    AFD_CHECK(total <= c.max_position_embeddings,
              "prompt {}: {} prompt tokens + {} new tokens exceed max_position_embeddings {}", s,
              prompt.size(), options.max_tokens, c.max_position_embeddings);
    const int slot = cache.AddSequence(std::max<int64_t>(total, 1));
    prefill.Add(slot, prompt, 0);
    results[s].prompt_ids = prompt;
  }
  GenerationStats local_stats;
  GenerationStats& st = stats ? *stats : local_stats;
  st = GenerationStats{};

  // Prefill: every prompt in one step. logits: [sum of prompt lengths, vocab].
  auto start = std::chrono::steady_clock::now();
  std::vector<float> logits(prefill.size() * vocab);
  runner_.Forward(prefill, cache, logits.data());
  st.prefill_tokens = prefill.size();
  st.prefill_seconds = Seconds(start);

  std::vector<Sampler> samplers;
  std::vector<float> scratch;
  std::vector<int> active;  // sequences still generating
  std::vector<const float*> last(prompts.size());  // logits row that predicts the next token
  int64_t row = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    samplers.emplace_back(options.sampling,
                          options.sampler_streams.empty() ? static_cast<int64_t>(s)
                                                          : options.sampler_streams.at(s));
    GenerationResult& r = results[s];
    const int64_t t = r.prompt_ids.size();
    r.prompt_logprobs.assign(t, std::nanf(""));
    for (int64_t j = 1; j < t; ++j) {
      r.prompt_logprobs[j] = LogProb(&logits[(row + j - 1) * vocab], vocab, r.prompt_ids[j], scratch);
    }
    if (options.keep_prompt_logits) {
      r.prompt_logits.assign(logits.begin() + row * vocab, logits.begin() + (row + t) * vocab);
    }
    last[s] = &logits[(row + t - 1) * vocab];
    row += t;
    if (options.max_tokens > 0) active.push_back(static_cast<int>(s));
  }

  auto is_eos = [&c](int32_t id) {
    return std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) != c.eos_token_ids.end();
  };
  std::vector<float> step_logits;
  start = std::chrono::steady_clock::now();
  while (!active.empty()) {
    // Pick each active sequence's next token from its last logits row.
    model::ForwardBatch step;
    std::vector<int> still_active;
    for (int s : active) {
      GenerationResult& r = results[s];
      const int32_t id = samplers[s].Sample(last[s], vocab);
      r.output_ids.push_back(id);
      r.logprobs.push_back(LogProb(last[s], vocab, id, scratch));
      const bool done = static_cast<int64_t>(r.output_ids.size()) >= options.max_tokens ||
                        (!options.ignore_eos && is_eos(id));
      if (done) continue;
      step.Add(s, {id}, cache.length(s));
      still_active.push_back(s);
    }
    active = std::move(still_active);
    if (active.empty()) break;
    step_logits.resize(step.size() * vocab);  // [active, vocab]
    runner_.Forward(step, cache, step_logits.data());
    for (size_t i = 0; i < active.size(); ++i) last[active[i]] = &step_logits[i * vocab];
    st.decode_tokens += step.size();
    ++st.decode_steps;
  }
  st.decode_seconds = Seconds(start);
  return results;
}

}  // namespace afd::runtime

#include "afd/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

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
  AFD_CHECK(options.max_num_seqs >= 0, "max_num_seqs must be >= 0, got {}", options.max_num_seqs);
  AFD_CHECK(options.max_num_batched_tokens >= 0, "max_num_batched_tokens must be >= 0, got {}",
            options.max_num_batched_tokens);
  AFD_CHECK(options.sampler_streams.empty() || options.sampler_streams.size() == prompts.size(),
            "{} sampler streams for {} prompts", options.sampler_streams.size(), prompts.size());
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
  }
  GenerationStats local_stats;
  GenerationStats& st = stats ? *stats : local_stats;
  st = GenerationStats{};

  model::MlaKvCache cache = model_.NewCache();
  std::vector<GenerationResult> results(prompts.size());
  std::vector<std::unique_ptr<Sampler>> samplers(prompts.size());
  std::vector<int> slot(prompts.size(), -1);             // KV cache slot of each admitted prompt
  std::vector<std::vector<float>> last(prompts.size());  // logits row predicting the next token
  std::vector<int> running;                              // admitted, still generating
  size_t next_waiting = 0;
  std::vector<float> scratch, logits;
  auto is_eos = [&c](int32_t id) {
    return std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) != c.eos_token_ids.end();
  };
  const size_t limit =
      options.max_num_seqs > 0 ? static_cast<size_t>(options.max_num_seqs) : prompts.size();
  while (true) {
    // Decode: the next token of every running sequence, from its last logits row.
    model::ForwardBatch batch;
    std::vector<int> decoding, prefilling;
    for (int s : running) {
      GenerationResult& r = results[s];
      const int32_t id = samplers[s]->Sample(last[s].data(), vocab);
      r.output_ids.push_back(id);
      r.logprobs.push_back(LogProb(last[s].data(), vocab, id, scratch));
      const bool done = static_cast<int64_t>(r.output_ids.size()) >= options.max_tokens ||
                        (!options.ignore_eos && is_eos(id));
      if (done) {
        cache.ReleaseSequence(slot[s]);
        std::vector<float>().swap(last[s]);
        continue;
      }
      batch.Add(slot[s], {id}, cache.length(slot[s]));
      decoding.push_back(s);
    }
    // Admit waiting prompts while there is room: their whole prompt is prefilled in this step.
    while (next_waiting < prompts.size() && decoding.size() + prefilling.size() < limit) {
      const int64_t len = static_cast<int64_t>(prompts[next_waiting].size());
      if (options.max_num_batched_tokens > 0 && batch.size() > 0 &&
          batch.size() + len > options.max_num_batched_tokens) {
        break;  // waits for a step with room
      }
      const int s = static_cast<int>(next_waiting++);
      const int64_t total = static_cast<int64_t>(prompts[s].size()) + options.max_tokens;
      slot[s] = cache.AddSequence(std::max<int64_t>(total, 1));
      batch.Add(slot[s], prompts[s], 0);
      prefilling.push_back(s);
      results[s].prompt_ids = prompts[s];
      samplers[s] = std::make_unique<Sampler>(options.sampling, options.sampler_streams.empty()
                                                                    ? static_cast<int64_t>(s)
                                                                    : options.sampler_streams[s]);
    }
    if (batch.size() == 0) break;
    const auto start = std::chrono::steady_clock::now();
    logits.resize(batch.size() * vocab);  // [batch tokens, vocab]
    runner_.Forward(batch, cache, logits.data());
    const double seconds = Seconds(start);
    const int64_t num_decode = static_cast<int64_t>(decoding.size());
    if (prefilling.empty()) {
      st.decode_tokens += num_decode;
      ++st.decode_steps;
      st.decode_seconds += seconds;
    } else if (decoding.empty()) {
      st.prefill_tokens += batch.size();
      st.prefill_seconds += seconds;
    } else {
      ++st.mixed_steps;
      st.mixed_prefill_tokens += batch.size() - num_decode;
      st.mixed_decode_tokens += num_decode;
      st.mixed_seconds += seconds;
    }
    // Rows: the decode tokens first, then each admitted prompt's tokens.
    int64_t row = 0;
    for (int s : decoding) {
      last[s].assign(logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
      ++row;
    }
    running = decoding;
    for (int s : prefilling) {
      GenerationResult& r = results[s];
      const int64_t t = static_cast<int64_t>(r.prompt_ids.size());
      r.prompt_logprobs.assign(t, std::nanf(""));
      for (int64_t j = 1; j < t; ++j) {
        r.prompt_logprobs[j] =
            LogProb(&logits[(row + j - 1) * vocab], vocab, r.prompt_ids[j], scratch);
      }
      if (options.keep_prompt_logits) {
        r.prompt_logits.assign(logits.begin() + row * vocab, logits.begin() + (row + t) * vocab);
      }
      last[s].assign(logits.begin() + (row + t - 1) * vocab, logits.begin() + (row + t) * vocab);
      row += t;
      if (options.max_tokens > 0) {
        running.push_back(s);
      } else {
        cache.ReleaseSequence(slot[s]);
      }
    }
  }
  return results;
}

}  // namespace afd::runtime

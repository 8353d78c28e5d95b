#include "afd/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "afd/common/error.h"
#include "afd/runtime/scheduler.h"

namespace afd::runtime {

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

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

Generator::Generator(const model::DeepseekModel& model)
    : model_(model),
      local_(std::make_unique<LocalStepRunner>(model)),
      runner_(*local_),
      ws_(model.backend()) {}

Generator::Generator(const model::DeepseekModel& model, StepRunner& runner)
    : model_(model), runner_(runner), ws_(model.backend()) {}

std::vector<GenerationResult> Generator::Generate(const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerationOptions& options,
                                                  GenerationStats* stats) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  const int64_t vocab = c.vocab_size;
  Validate(c, prompts, options);
  GenerationStats local_stats;
  GenerationStats& st = stats ? *stats : local_stats;
  st = GenerationStats{};
  const bool want_prompt_logprobs = options.prompt_logprobs || options.keep_prompt_logits;

  kv::CacheShape shape = model_.CacheShape(1);
  int64_t blocks = options.num_kv_blocks;
  if (blocks == 0) {
    for (const auto& p : prompts) {
      blocks += shape.BlocksFor(static_cast<int64_t>(p.size()) + options.max_tokens + 1);
    }
  }
  shape.num_blocks = std::max<int64_t>(blocks, 1);
  st.kv_blocks = shape.num_blocks;
  kv::PagedKvCache cache(backend, shape);
  Scheduler scheduler({options.max_num_seqs, options.max_num_batched_tokens}, cache);

  std::vector<GenerationResult> results(prompts.size());
  std::vector<Sampler> samplers;
  samplers.reserve(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    results[s].prompt_ids = prompts[s];
    samplers.emplace_back(options.sampling, options.sampler_streams.empty()
                                                ? static_cast<int64_t>(s)
                                                : options.sampler_streams[s]);
    scheduler.Add(static_cast<int64_t>(s), prompts[s], want_prompt_logprobs);
  }
  auto is_eos = [&c](int32_t id) {
    return std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) != c.eos_token_ids.end();
  };
  std::vector<int32_t> ids, targets;
  std::vector<float> logprobs;
  while (scheduler.HasWork()) {
    const StepPlan plan = scheduler.Schedule();
    AFD_CHECK(!plan.empty(), "scheduler: work left but nothing scheduled");
    st.peak_kv_blocks = std::max(st.peak_kv_blocks, cache.num_used_blocks());
    const auto start = std::chrono::steady_clock::now();
    ws_.Reset();
    const Tensor logits = runner_.Forward(plan.batch, cache, ws_);  // [m, vocab]
    const int64_t m = logits.dim(0);
    // Each sequence's last logits row is sampled; the others (prompt rows) stay greedy and unused.
    std::vector<kernels::SampleRow> rows(m);
    for (const ScheduledSeq& e : plan.seqs) {
      rows[e.first_logits_row + e.num_logits_rows - 1] = samplers[e.request].NextRow();
    }
    const Tensor ids_t = ws_.Take(DType::kI32, {m});
    backend.Sample(logits, rows, ids_t);
    ids.resize(m);
    backend.CopyToHost(ids.data(), ids_t);
    // Log-probabilities at the sampled ids, and at the next prompt token for prompt rows.
    targets = ids;
    for (const ScheduledSeq& e : plan.seqs) {
      const auto& prompt = prompts[e.request];
      for (int64_t r = 0; r + 1 < e.num_logits_rows; ++r) {
        targets[e.first_logits_row + r] = prompt[r + 1];
      }
    }
    const Tensor targets_t = ws_.Take(DType::kI32, {m});
    backend.CopyToDevice(targets_t, targets.data());
    const Tensor lp_t = ws_.Take(DType::kF32, {m});
    backend.LogSoftmaxAt(logits, targets_t, lp_t);
    logprobs.resize(m);
    backend.CopyToHost(logprobs.data(), lp_t);

    std::vector<int32_t> next(plan.seqs.size());
    std::vector<char> finished(plan.seqs.size(), 0);
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const ScheduledSeq& e = plan.seqs[i];
      GenerationResult& r = results[e.request];
      if (e.first_prefill && want_prompt_logprobs) {
        const int64_t t = static_cast<int64_t>(r.prompt_ids.size());
        r.prompt_logprobs.assign(t, std::nanf(""));
        for (int64_t j = 1; j < t; ++j) r.prompt_logprobs[j] = logprobs[e.first_logits_row + j - 1];
        if (options.keep_prompt_logits) {
          r.prompt_logits.resize(t * vocab);
          backend.CopyToHost(r.prompt_logits.data(), logits.Rows(e.first_logits_row, t));
        }
      }
      if (options.max_tokens == 0) {
        finished[i] = 1;
        continue;
      }
      const int64_t last = e.first_logits_row + e.num_logits_rows - 1;
      const int32_t id = ids[last];
      r.output_ids.push_back(id);
      r.logprobs.push_back(logprobs[last]);
      next[i] = id;
      finished[i] = static_cast<int64_t>(r.output_ids.size()) >= options.max_tokens ||
                    (!options.ignore_eos && is_eos(id));
    }
    scheduler.Update(plan, next, finished);
    const double seconds = Seconds(start);
    if (plan.num_prefill_tokens == 0) {
      st.decode_tokens += plan.num_decode_tokens;
      ++st.decode_steps;
      st.decode_seconds += seconds;
    } else if (plan.num_decode_tokens == 0) {
      st.prefill_tokens += plan.num_prefill_tokens;
      st.prefill_seconds += seconds;
    } else {
      ++st.mixed_steps;
      st.mixed_prefill_tokens += plan.num_prefill_tokens;
      st.mixed_decode_tokens += plan.num_decode_tokens;
      st.mixed_seconds += seconds;
    }
  }
  st.preemptions = scheduler.num_preemptions();
  return results;
}

}  // namespace afd::runtime

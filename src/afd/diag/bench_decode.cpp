#include "afd/diag/bench_decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "afd/common/error.h"
#include "afd/runtime/engine.h"
#include "afd/runtime/request.h"

namespace afd::diag {

using runtime::CudaGraphOptions;
using runtime::CudaGraphRunner;
using runtime::Engine;
using runtime::EngineOptions;
using runtime::FinishReason;
using runtime::GenerationStats;
using runtime::RequestOutput;
using runtime::RequestParams;
using runtime::StepRunner;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes of one tensor (0 when empty).
double Bytes(const Tensor& t) { return t.empty() ? 0.0 : static_cast<double>(t.nbytes()); }

// Bytes a decode step of `batch` sequences reads from the weights.
double WeightBytes(const model::MoeModel& m, int64_t batch) {
  const model::ModelConfig& c = m.config();
  const model::ModelWeights& w = m.weights();
  double total =
      Bytes(w.final_norm) + Bytes(w.lm_head) + batch * c.hidden_size * 4.0;  // embed rows
  const double e = static_cast<double>(c.n_routed_experts), k = c.num_experts_per_tok;
  const double touched = e > 0 ? e * (1.0 - std::pow(1.0 - k / e, static_cast<double>(batch))) : 0;
  for (const model::LayerWeights& l : w.layers) {
    for (const Tensor* t :
         {&l.attn.input_norm, &l.attn.q_proj, &l.attn.q_a_proj, &l.attn.q_a_norm, &l.attn.q_b_proj,
          &l.attn.kv_a_proj, &l.attn.kv_a_norm, &l.attn.kv_b_proj, &l.attn.o_proj,
          &l.post_attention_norm, &l.dense.gate_up, &l.dense.down, &l.moe.gate,
          &l.moe.shared.gate_up, &l.moe.shared.down}) {
      total += Bytes(*t);
    }
    if (!l.moe.experts.gate_up.empty()) {
      total += touched * (Bytes(l.moe.experts.gate_up[0]) + Bytes(l.moe.experts.down[0]));
    }
  }
  return total;
}

// Wraps the step runner of the bench: from the first timed decode step on (`timing`), times the
// device work of each decode step's forward (Backend timed spans) and, with `profile`, records
// the backend's per-op times of the decode steps (from each decode step's Forward until the next
// Forward, so the engine's sampling and copies count too).
class BenchRunner : public StepRunner {
 public:
  BenchRunner(StepRunner& inner, kernels::Backend& backend, bool profile)
      : inner_(inner), backend_(backend), profile_(profile) {}
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                 Workspace& ws) override {
    const bool decode = batch.size() == static_cast<int64_t>(batch.seq_ids.size());
    if (profile_ && !decode) {
      // A prefill (or mixed) step's own per-op times, kept apart from the decode steps' (an
      // external profiler's range stays on the decode steps).
      backend_.SetProfiling(true, /*profiler_range=*/false);
      Tensor logits = inner_.Forward(batch, cache, ws);
      backend_.SetProfiling(false);
      for (const kernels::OpTime& t : backend_.TakeProfile()) {
        auto it = std::find_if(prefill_profile.begin(), prefill_profile.end(),
                               [&](const kernels::OpTime& p) { return p.op == t.op; });
        if (it == prefill_profile.end()) {
          prefill_profile.push_back(t);
        } else {
          it->calls += t.calls;
          it->ms += t.ms;
        }
      }
      ++prefill_steps;
      return logits;
    }
    if (profile_) backend_.SetProfiling(decode && timing);
    if (!(decode && timing)) return inner_.Forward(batch, cache, ws);
    // The step's device time: from here to the copy of its sampled ids (StepEnqueued).
    backend_.BeginTimedSpan();
    span_open_ = true;
    return inner_.Forward(batch, cache, ws);
  }
  bool TakesDeviceIds() const override { return inner_.TakesDeviceIds(); }
  void StepEnqueued() override {
    if (span_open_) backend_.EndTimedSpan();
    span_open_ = false;
  }
  bool timing = false;
  std::vector<kernels::OpTime> prefill_profile;  // summed over prefill_steps
  int64_t prefill_steps = 0;

 private:
  StepRunner& inner_;
  kernels::Backend& backend_;
  bool profile_;
  bool span_open_ = false;
};

// Op times summed over `steps` steps -> per step, slowest first.
std::vector<kernels::OpTime> PerStep(std::vector<kernels::OpTime> times, int64_t steps) {
  for (kernels::OpTime& t : times) {
    t.ms /= static_cast<double>(std::max<int64_t>(steps, 1));
    t.calls = std::llround(t.calls / static_cast<double>(std::max<int64_t>(steps, 1)));
  }
  std::sort(times.begin(), times.end(),
            [](const kernels::OpTime& a, const kernels::OpTime& b) { return a.ms > b.ms; });
  return times;
}

// Decode steps of each batch run before the timed ones: the first captures the batch's CUDA
// graph (after an eager warm-up run), which the timed steps then replay.
constexpr int64_t kWarmupSteps = 2;

}  // namespace

double PrefillFlopsPerToken(const model::MoeModel& m, int64_t context) {
  const model::ModelConfig& c = m.config();
  const model::ModelWeights& w = m.weights();
  double macs = static_cast<double>(w.lm_head.numel()) / static_cast<double>(context);
  const double mean_prefix = (static_cast<double>(context) + 1.0) / 2.0;
  for (const model::LayerWeights& l : w.layers) {
    for (const Tensor* t :
         {&l.attn.qkv_proj, &l.attn.q_proj, &l.attn.q_a_proj, &l.attn.q_b_proj, &l.attn.kv_a_proj,
          &l.attn.kv_b_proj, &l.attn.o_proj, &l.dense.gate_up, &l.dense.down, &l.moe.gate,
          &l.moe.shared.gate_up, &l.moe.shared.down}) {
      macs += static_cast<double>(t->numel());
    }
    if (!l.moe.experts.gate_up.empty()) {
      macs += static_cast<double>(c.num_experts_per_tok) *
              static_cast<double>(l.moe.experts.gate_up[0].numel() + l.moe.experts.down[0].numel());
    }
    // Scores and P·V per head over the mean prefix: MLA's absorbed form reads the latent twice
    // and the rope key once; GQA's q·k and p·v are d each.
    const double per_head = c.attention() == model::AttentionKind::kGqa
                                ? 2.0 * static_cast<double>(c.head_dim)
                                : static_cast<double>(2 * c.kv_lora_rank + c.qk_rope_head_dim);
    macs += static_cast<double>(c.num_attention_heads) * mean_prefix * per_head;
  }
  return 2.0 * macs;
}

double MeasureCopyBandwidth(kernels::Backend& backend) {
  const int64_t n = backend.device().is_cpu() ? (int64_t{64} << 20) : (int64_t{1} << 28);  // floats
  std::shared_ptr<void> a = backend.Allocate(n * 4), b = backend.Allocate(n * 4);
  const Tensor ta(a.get(), DType::kF32, {n}, backend.device(), a);
  const Tensor tb(b.get(), DType::kF32, {n}, backend.device(), b);
  backend.Fill(ta, 1.0f);
  backend.Copy(tb, ta);
  backend.Synchronize();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const double t0 = Now();
    backend.Copy(tb, ta);
    backend.Synchronize();
    best = std::max(best, 2.0 * n * 4.0 / (Now() - t0) / 1e9);  // bytes read + written
  }
  return best;
}

namespace {

// The prefill waves of a batch's prompts (lengths in order): whole prompts, as many as fit
// `budget` tokens a wave (at least one); each wave's tokens.
std::vector<int64_t> Waves(const std::vector<int64_t>& lengths, int64_t budget) {
  std::vector<int64_t> waves;
  for (int64_t len : lengths) {
    if (waves.empty() || (waves.back() + len > budget)) {
      waves.push_back(len);
    } else {
      waves.back() += len;
    }
  }
  return waves;
}

// How a batch's prompts are prefilled: whole prompts in waves of up to `per_step` tokens; or, when
// one prompt alone is longer (long contexts), chunked prefill of `per_step` tokens a step beside
// the running sequences' decodes.
struct PrefillPlan {
  bool chunked = false;
  int64_t waves = 1;        // prefill steps at most before every sequence runs
  int64_t max_batched = 0;  // EngineOptions::max_num_batched_tokens
};

PrefillPlan PlanPrefill(const std::vector<int64_t>& lengths, int64_t per_step) {
  const int64_t b = static_cast<int64_t>(lengths.size());
  PrefillPlan p;
  if (*std::max_element(lengths.begin(), lengths.end()) <= per_step) {
    const std::vector<int64_t> waves = Waves(lengths, per_step);
    p.waves = static_cast<int64_t>(waves.size());
    // Room for a wave's prompts beside every running sequence's decode token (the engine admits
    // prompts in order while they fit, so it never takes more waves than these).
    p.max_batched = *std::max_element(waves.begin(), waves.end()) + b;
  } else {
    // Each step carries at least per_step prompt tokens (the budget less the decodes).
    int64_t total = 0;
    for (int64_t len : lengths) total += len;
    p.chunked = true;
    p.waves = (total + per_step - 1) / per_step;
    p.max_batched = per_step + b;
  }
  return p;
}

}  // namespace

BenchDecodeResult BenchDecode(const model::MoeModel& model, const BenchDecodeOptions& o) {
  const model::ModelConfig& c = model.config();
  AFD_CHECK(o.context >= 1 && o.steps >= 1,
            "bench decode: --context {} and --steps {} must be >= 1", o.context, o.steps);
  AFD_CHECK(o.prefill_tokens_per_step >= 1, "bench decode: prefill_tokens_per_step {} must be >= 1",
            o.prefill_tokens_per_step);
  // Each row's batch: its sequences' prompt lengths.
  std::vector<std::vector<int64_t>> batches;
  if (o.context_mix.empty()) {
    AFD_CHECK(!o.batch_sizes.empty(), "bench decode: no batch sizes");
    for (int64_t b : o.batch_sizes) {
      AFD_CHECK(b >= 1, "bench decode: batch size {} must be >= 1", b);
      batches.emplace_back(b, o.context);
    }
  } else {
    std::vector<int64_t> mix;
    for (const auto& [count, len] : o.context_mix) {
      AFD_CHECK(count >= 1 && len >= 1,
                "bench decode: --context-mix {}x{}: counts and lengths must be >= 1", count, len);
      mix.insert(mix.end(), count, len);
    }
    batches.push_back(std::move(mix));
  }
  // A sequence of an early prefill wave decodes one token in each later wave.
  for (const std::vector<int64_t>& lengths : batches) {
    const int64_t waves = PlanPrefill(lengths, o.prefill_tokens_per_step).waves;
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    AFD_CHECK(longest + kWarmupSteps + o.steps + waves + 1 <= c.max_position_embeddings,
              "bench decode: a prompt of {} tokens + --steps {} (+ {} warm-up steps, + {} tokens "
              "decoded while later prompts prefill, + 2: the prefill's token and the step after "
              "the timed ones) exceed max_position_embeddings {}",
              longest, o.steps, kWarmupSteps, waves - 1, c.max_position_embeddings);
  }
  AFD_CHECK(!o.kernel_trace || (!o.profile && !o.graphs.enforce_eager),
            "bench decode: a kernel trace follows the CUDA graph replays of the timed steps: "
            "not with --profile or --enforce-eager (eager steps)");
  BenchDecodeResult result;
  result.device = model.backend().name();
  result.copy_gb_per_s = MeasureCopyBandwidth(model.backend());
  CudaGraphOptions graph_options = o.graphs;
  graph_options.enforce_eager = graph_options.enforce_eager || o.profile;
  CudaGraphRunner graph_runner(model, graph_options);
  BenchRunner runner(graph_runner, model.backend(), o.profile);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab_size - 1));
  const kv::CacheShape shape = model.CacheShape(1);
  const double kv_row_bytes = static_cast<double>(shape.row_width) * DTypeSize(shape.dtype) *
                              static_cast<double>(c.num_hidden_layers);
  for (const std::vector<int64_t>& lengths : batches) {
    const int64_t b = static_cast<int64_t>(lengths.size());
    const PrefillPlan plan = PlanPrefill(lengths, o.prefill_tokens_per_step);
    const int64_t waves = plan.waves;
    EngineOptions eo;
    eo.num_kv_blocks = 0;
    for (int64_t len : lengths) {
      eo.num_kv_blocks += shape.BlocksFor(len + kWarmupSteps + o.steps + waves + 1);
    }
    eo.max_num_batched_tokens = plan.max_batched;
    eo.chunked_prefill = plan.chunked;
    eo.async_scheduling = o.async_scheduling;
    {
      // A first wave's prefill, untimed: the first launch of each kernel a prefill needs loads
      // its module (CUDA's lazy loading: ~40 ms for a cuBLAS GEMM's the first time), which a
      // server pays once, not per prefill.
      Engine warm_engine(model, runner, eo);
      int64_t first_wave = 0;  // (chunked: one prompt, a step's worth at most)
      for (int64_t s = 0;
           s < b &&
           (s == 0 || (!plan.chunked && first_wave + lengths[s] <= o.prefill_tokens_per_step));
           ++s) {
        const int64_t len =
            plan.chunked ? std::min(lengths[s], o.prefill_tokens_per_step) : lengths[s];
        first_wave += len;
        RequestParams p;
        p.prompt.resize(len);
        for (int32_t& t : p.prompt) t = id(rng);
        p.max_tokens = 1;
        p.ignore_eos = true;
        warm_engine.Add(static_cast<uint64_t>(s), std::move(p));
      }
      while (warm_engine.HasWork()) {
        for (const RequestOutput& out : warm_engine.Step()) {
          AFD_CHECK(out.finish_reason != FinishReason::kError, "bench decode: {}", out.error);
        }
      }
      runner.prefill_profile.clear();
      runner.prefill_steps = 0;
    }
    // The trace starts before the batch's graph is captured (CUPTI sees its kernels from
    // then on); the summary takes the timed steps' replays out of it.
    const int64_t graph_steps_traced = graph_runner.graph_steps();
    if (o.kernel_trace) model.backend().SetKernelTrace(true);
    Engine engine(model, runner, eo);
    for (int64_t s = 0; s < b; ++s) {
      RequestParams p;
      p.prompt.resize(lengths[s]);
      for (int32_t& t : p.prompt) t = id(rng);
      // The first token comes from the prefill step, then the warm-up and the timed steps.
      // Long enough for the first wave, which decodes while the later ones prefill, and for
      // one more step (the last timed step launches the next ahead as every timed step does);
      // the bench stops after the timed steps, with every sequence still running.
      p.max_tokens = 2 + kWarmupSteps + o.steps + (waves - 1);
      p.sampler_stream = s;
      p.ignore_eos = true;
      p.logprobs = 0;  // as afd run asks (the log-probability of every output token)
      engine.Add(static_cast<uint64_t>(s), std::move(p));
    }
    runner.timing = false;
    GenerationStats warm;  // the engine's stats when the timed steps begin
    int64_t graph_steps_warm = graph_runner.graph_steps();
    bool warmed = false;
    while (engine.HasWork()) {
      for (const RequestOutput& out : engine.Step()) {
        AFD_CHECK(out.finish_reason != FinishReason::kError, "bench decode: {}", out.error);
      }
      // The timed steps are the decode steps kWarmupSteps + 1 .. kWarmupSteps + steps (the
      // window's wall time is that of the Step calls that complete them); their device time is
      // that of their launches. The next call launches decode step done + 1, or done + 2 when a
      // step is in flight (asynchronous scheduling: the call completes that one and launches
      // the next). Nothing here waits for the device, which would empty the pipeline.
      const int64_t done = engine.generation_stats().decode_steps;
      const int64_t next_launch = done + (engine.HasStepInFlight() ? 2 : 1);
      runner.timing = next_launch > kWarmupSteps && next_launch <= kWarmupSteps + o.steps;
      if (!warmed && done == kWarmupSteps) {
        warm = engine.generation_stats();
        graph_steps_warm = graph_runner.graph_steps();
        warmed = true;
      }
      if (warmed && done - warm.decode_steps == o.steps) break;
    }
    runner.timing = false;
    const GenerationStats& st = engine.generation_stats();
    const int64_t steps = st.decode_steps - warm.decode_steps;
    const double seconds = st.decode_seconds - warm.decode_seconds;
    AFD_CHECK(steps == o.steps, "bench decode: {} timed decode steps at batch {}, expected {}",
              steps, b, o.steps);
    BenchDecodeRow row;
    row.batch = b;
    // Graph replays of the timed steps' launches (with a step in flight, one later each).
    row.graph_steps = graph_runner.graph_steps() - graph_steps_warm;
    row.ahead_steps = st.ahead_steps - warm.ahead_steps;
    if (o.kernel_trace) {
      const std::vector<kernels::KernelSpan> spans = model.backend().TakeKernelTrace();
      AFD_CHECK(row.graph_steps > 0,
                "bench decode --kernel-trace: batch {}'s timed steps ran eagerly (no CUDA graph "
                "for that size: see --cuda-graph-sizes)",
                b);
      row.kernel_trace =
          SummarizeKernelTrace(spans, graph_steps_warm - graph_steps_traced, row.graph_steps);
    }
    if (o.profile) {
      model.backend().SetProfiling(false);
      row.profile = PerStep(model.backend().TakeProfile(), steps);
      row.prefill_profile = PerStep(std::move(runner.prefill_profile), runner.prefill_steps);
      row.prefill_steps = runner.prefill_steps;
      runner.prefill_profile.clear();
      runner.prefill_steps = 0;
    }
    row.ms_per_step = 1e3 * seconds / static_cast<double>(steps);
    row.device_ms_per_step = 1e3 * model.backend().TakeTimedSeconds() / static_cast<double>(steps);
    row.tokens_per_s = (st.decode_tokens - warm.decode_tokens) / std::max(seconds, 1e-12);
    // KV read by the average timed step: each sequence's cache at mid-run length.
    row.bytes_per_step = WeightBytes(model, b);
    double prompt_tokens = 0, prefill_flops = 0;
    for (int64_t len : lengths) {
      row.bytes_per_step += (len + kWarmupSteps + o.steps / 2.0) * kv_row_bytes;
      prompt_tokens += static_cast<double>(len);
      prefill_flops += static_cast<double>(len) * PrefillFlopsPerToken(model, len);
    }
    row.floor_ms = 1e3 * row.bytes_per_step / (result.copy_gb_per_s * 1e9);
    // Prefill steps, and the mixed ones of later waves (their few decode tokens included).
    row.prefill_tokens_per_s = (st.prefill_tokens + st.mixed_prefill_tokens) /
                               std::max(st.prefill_seconds + st.mixed_seconds, 1e-12);
    // (FLOPs per token: the prompts' own, weighted by their tokens.)
    row.prefill_tflops = row.prefill_tokens_per_s * prefill_flops / prompt_tokens / 1e12;
    result.rows.push_back(row);
  }
  return result;
}

}  // namespace afd::diag

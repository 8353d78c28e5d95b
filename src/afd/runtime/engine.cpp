#include "afd/runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "afd/common/error.h"

namespace afd::runtime {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

namespace {

constexpr double kMaxKvHoldSeconds = 86400;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// The k most likely tokens of a row of logits (ties: lower id first; NaN never ranks above a
// number) with their log-probabilities, computed as the CPU reference's log-softmax does.
std::vector<TopLogprob> TopK(const std::vector<float>& row, int64_t k, double log_sum) {
  const int64_t vocab = static_cast<int64_t>(row.size());
  k = std::min(k, vocab);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&row](int32_t a, int32_t b) {
    const float x = row[a], y = row[b];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) || (std::isnan(y) && a < b);
    return x > y || (x == y && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  std::vector<TopLogprob> top(k);
  for (int64_t i = 0; i < k; ++i) {
    top[i] = {ids[i], static_cast<float>(row[ids[i]] - log_sum)};
  }
  return top;
}

}  // namespace

Engine::Engine(const model::MoeModel& model, StepRunner& runner, const EngineOptions& options)
    : staged_(options.kv_stage_bytes), model_(model), runner_(runner), ws_(model.backend()) {
  const model::ModelConfig& c = model.config();
  AFD_CHECK(options.num_kv_blocks > 0, "the engine needs KV cache blocks (num_kv_blocks {})",
            options.num_kv_blocks);
  AFD_CHECK(options.max_model_len >= 0, "max_model_len must be >= 0, got {}",
            options.max_model_len);
  AFD_CHECK(options.max_model_len <= c.max_position_embeddings,
            "max_model_len {} exceeds the model's max_position_embeddings {}",
            options.max_model_len, c.max_position_embeddings);
  max_model_len_ = options.max_model_len > 0 ? options.max_model_len : c.max_position_embeddings;
  kv::CacheShape shape = model.CacheShape(options.num_kv_blocks);
  cache_ = std::make_unique<kv::PagedKvCache>(model.backend(), shape);
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerLimits{options.max_num_seqs, options.max_num_batched_tokens,
                      options.chunked_prefill},
      *cache_);
  gen_stats_.kv_blocks = shape.num_blocks;
  scheduler_->SetImportHook(
      [this](int64_t index, int64_t seq, int64_t cached) { ImportRows(index, seq, cached); });
  async_ = runner.TakesDeviceIds() && (options.async_scheduling == AsyncScheduling::kOn ||
                                       (options.async_scheduling == AsyncScheduling::kAuto &&
                                        model.backend().RunsAsynchronously()));
}

Engine::~Engine() {
  // A step launched ahead whose results nobody took: wait for it (it writes the cache).
  if (inflight_ && inflight_->ticket >= 0) {
    try {
      std::vector<int32_t> back(inflight_->with_logprobs ? 2 * inflight_->m : inflight_->m);
      model_.backend().FinishCopyToHost(inflight_->ticket, back.data());
    } catch (const std::exception&) {  // a device failure was reported where it happened
    }
  }
}

std::string Engine::Check(const RequestParams& p) const {
  const model::ModelConfig& c = model_.config();
  if (p.prompt.empty()) return "the prompt is empty";
  for (int32_t id : p.prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
    }
  }
  if (p.max_tokens < 0) return fmt::format("max_tokens must be >= 0, got {}", p.max_tokens);
  const int64_t len = static_cast<int64_t>(p.prompt.size());
  if (len + p.max_tokens > max_model_len_) {
    return fmt::format("{} prompt tokens + {} new tokens exceed the maximum model length {}", len,
                       p.max_tokens, max_model_len_);
  }
  if (p.logprobs > c.vocab_size || p.prompt_logprobs > c.vocab_size) {
    return fmt::format("logprobs {} / prompt_logprobs {} exceed the vocabulary size {}", p.logprobs,
                       p.prompt_logprobs, c.vocab_size);
  }
  const int64_t blocks = cache_->shape().BlocksFor(len + 1);
  if (blocks > cache_->shape().num_blocks) {
    return fmt::format("a prompt of {} tokens needs {} KV cache blocks, the cache has {}", len,
                       blocks, cache_->shape().num_blocks);
  }
  try {
    ValidateSamplingParams(p.sampling);
  } catch (const Error& e) {
    return e.what();
  }
  if (!(p.hold_kv_s >= 0 && p.hold_kv_s <= kMaxKvHoldSeconds)) {
    return fmt::format("hold_kv_s {} must be in [0, {}] seconds", p.hold_kv_s, kMaxKvHoldSeconds);
  }
  if (const KvRows* kv = p.imported_kv.get()) {
    const kv::CacheShape& shape = cache_->shape();
    if (p.prompt_logprobs >= 0 || p.keep_prompt_logits) {
      return "imported KV rows: prompt log-probabilities need the prompt computed here";
    }
    if (kv->num_layers != shape.num_layers || kv->row_width != shape.row_width ||
        kv->dtype != shape.dtype) {
      return fmt::format(
          "imported KV rows: {} layers of {}-wide {} rows, this model's cache has {} layers of "
          "{}-wide {} rows",
          kv->num_layers, kv->row_width, DTypeName(kv->dtype), shape.num_layers, shape.row_width,
          DTypeName(shape.dtype));
    }
    if (kv->positions < 0 || kv->positions > len) {
      return fmt::format("imported KV rows: {} positions for a prompt of {} tokens", kv->positions,
                         len);
    }
    if (const std::optional<KvDeviceRows>& d = kv->device) {
      // (Slots index int32 blocks: more than 2^31 is no cache's.)
      if (d->block_size <= 0 || d->num_slots <= 0 || d->num_slots > (int64_t{1} << 31) ||
          d->num_slots % d->block_size != 0 ||
          static_cast<int64_t>(d->blocks.size()) * d->block_size < kv->positions) {
        return fmt::format(
            "imported device KV rows: {} blocks of {} slots ({} per layer) for {} "
            "positions",
            d->blocks.size(), d->block_size, d->num_slots, kv->positions);
      }
      for (const int32_t b : d->blocks) {
        if (b < 0 || b >= d->num_slots / d->block_size) {
          return fmt::format("imported device KV rows: block {} outside the producer's {}", b,
                             d->num_slots / d->block_size);
        }
      }
      if (!model_.backend().SupportsIpc()) {
        return fmt::format(
            "imported KV rows in another process's GPU memory: {} cannot read "
            "them (the cuda_ipc KV transport needs a GPU on both sides)",
            model_.backend().name());
      }
      // Opened here (once per producer), and the allocation must hold the cache the description
      // claims: a failure rejects this request, not the engine's step.
      try {
        const int64_t extent = kv->num_layers * d->num_slots * kv->row_width *
                               static_cast<int64_t>(DTypeSize(kv->dtype));
        model_.backend().CopyFromIpc(cache_->Layer(0).Rows(0, 0), d->ipc_handle, extent);
      } catch (const Error& e) {
        return fmt::format("imported device KV rows: {}", e.what());
      }
    } else if (static_cast<int64_t>(kv->bytes.size()) != kv->expected_bytes()) {
      return fmt::format("imported KV rows: {} bytes, {} positions x {} layers need {}",
                         kv->bytes.size(), kv->positions, kv->num_layers, kv->expected_bytes());
    }
  }
  return {};
}

namespace {

// Calls fn(layer offset of the position run in the rows, first slot, count) for each block's run
// of positions [0, positions) of `blocks` (block_size each), one layer's worth.
template <typename Fn>
void ForEachBlockRun(const std::vector<int32_t>& blocks, int64_t block_size, int64_t positions,
                     Fn fn) {
  for (int64_t p = 0; p < positions; p += block_size) {
    const int64_t count = std::min(block_size, positions - p);
    fn(p, static_cast<int64_t>(blocks[p / block_size]) * block_size, count);
  }
}

}  // namespace

void Engine::ImportRows(int64_t index, int64_t seq, int64_t cached) {
  Live& live = live_.at(index);
  const KvRows& kv = *live.params.imported_kv;
  const kv::CacheShape& shape = cache_->shape();
  const int64_t row_bytes = shape.row_width * static_cast<int64_t>(DTypeSize(shape.dtype));
  kernels::Backend& backend = model_.backend();
  const std::vector<int32_t>& blocks = cache_->block_table(seq);
  if (kv.device) {
    // Device to device from the producer's cache (CUDA IPC); the two block sizes may differ.
    // The runs of positions contiguous on both sides (the same in every layer) merge across
    // block boundaries where both sides' next blocks follow on: one copy per run and layer.
    const KvDeviceRows& d = *kv.device;
    const int64_t bs = shape.block_size;
    struct Run {
      int64_t src, dst, n;
    };
    std::vector<Run> runs;
    for (int64_t p = 0; p < cached;) {
      const int64_t n = std::min({bs - p % bs, d.block_size - p % d.block_size, cached - p});
      const int64_t src =
          static_cast<int64_t>(d.blocks[p / d.block_size]) * d.block_size + p % d.block_size;
      const int64_t dst = static_cast<int64_t>(blocks[p / bs]) * bs + p % bs;
      if (!runs.empty() && runs.back().src + runs.back().n == src &&
          runs.back().dst + runs.back().n == dst) {
        runs.back().n += n;
      } else {
        runs.push_back({src, dst, n});
      }
      p += n;
    }
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      const Tensor layer = cache_->Layer(l);
      for (const Run& r : runs) {
        backend.CopyFromIpc(layer.Rows(r.dst, r.n), d.ipc_handle,
                            (l * d.num_slots + r.src) * row_bytes);
      }
    }
    backend.Synchronize();  // copied before the producer may free (and reuse) its blocks
  } else {
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      const Tensor layer = cache_->Layer(l);
      const char* rows = kv.bytes.data() + l * kv.positions * row_bytes;
      ForEachBlockRun(blocks, shape.block_size, cached, [&](int64_t p, int64_t slot, int64_t n) {
        backend.CopyToDevice(layer.Rows(slot, n), rows + p * row_bytes);
      });
    }
  }
  cache_->Extend(seq, cached);
  live.params.imported_kv.reset();  // written: this copy is not needed any more
  live.kv_imported = true;
}

std::shared_ptr<const KvRows> Engine::ReadRows(int64_t cache_seq, int64_t positions) const {
  const kv::CacheShape& shape = cache_->shape();
  auto kv = std::make_shared<KvRows>();
  kv->num_layers = shape.num_layers;
  kv->row_width = shape.row_width;
  kv->positions = positions;
  kv->dtype = shape.dtype;
  kv->bytes.resize(kv->expected_bytes());
  const int64_t row_bytes = shape.row_width * static_cast<int64_t>(DTypeSize(shape.dtype));
  kernels::Backend& backend = model_.backend();
  const std::vector<int32_t>& blocks = cache_->block_table(cache_seq);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const Tensor layer = cache_->Layer(l);
    char* rows = kv->bytes.data() + l * positions * row_bytes;
    ForEachBlockRun(blocks, shape.block_size, positions, [&](int64_t p, int64_t slot, int64_t n) {
      backend.CopyToHost(rows + p * row_bytes, layer.Rows(slot, n));
    });
  }
  return kv;
}

std::shared_ptr<const KvRows> Engine::ExportHeldKv(uint64_t id, bool device_ok) {
  if (std::shared_ptr<const KvRows> staged = staged_.Find(id)) return staged;
  const auto it = held_.find(id);
  AFD_CHECK(it != held_.end(),
            "request {} holds no KV rows (unknown, already released, or past its hold timeout)",
            id);
  kernels::Backend& backend = model_.backend();
  if (!device_ok || !backend.SupportsIpc()) {
    return ReadRows(it->second.cache_seq, it->second.positions);
  }
  const kv::CacheShape& shape = cache_->shape();
  if (cache_ipc_handle_.empty()) cache_ipc_handle_ = backend.IpcHandle(cache_->storage());
  auto kv = std::make_shared<KvRows>();
  kv->num_layers = shape.num_layers;
  kv->row_width = shape.row_width;
  kv->positions = it->second.positions;
  kv->dtype = shape.dtype;
  KvDeviceRows& d = kv->device.emplace();
  d.ipc_handle = cache_ipc_handle_;
  d.num_slots = shape.num_blocks * shape.block_size;
  d.block_size = shape.block_size;
  const std::vector<int32_t>& blocks = cache_->block_table(it->second.cache_seq);
  const int64_t used = (kv->positions + shape.block_size - 1) / shape.block_size;
  d.blocks.assign(blocks.begin(), blocks.begin() + used);
  return kv;
}

void Engine::ReleaseHeldKv(uint64_t id) {
  if (staged_.Erase(id)) return;
  const auto it = held_.find(id);
  if (it == held_.end()) return;
  cache_->Release(it->second.cache_seq);
  held_.erase(it);
}

void Engine::ExpireHeldKv() {
  staged_.Expire();
  const auto now = std::chrono::steady_clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    cache_->Release(it->second.cache_seq);
    it = held_.erase(it);
  }
}

void Engine::Add(uint64_t id, RequestParams params) {
  AFD_CHECK(!index_of_.count(id), "request id {} is already live", id);
  ExpireHeldKv();  // a new request may need the blocks
  const std::string problem = Check(params);
  if (!problem.empty()) {
    pending_.push_back(RequestOutput::Rejected(id, problem));
    pending_.back().num_prompt_tokens = static_cast<int64_t>(params.prompt.size());
    return;
  }
  const int64_t index = next_index_++;
  const bool all_rows = params.prompt_logprobs >= 0 || params.keep_prompt_logits;
  const int64_t cached =
      params.imported_kv
          ? std::min(params.imported_kv->positions, static_cast<int64_t>(params.prompt.size()) - 1)
          : 0;
  if (cached == 0) params.imported_kv.reset();
  scheduler_->Add(index, params.prompt, all_rows, cached, params.hold_kv_s > 0);
  const Sampler sampler(params.sampling, params.sampler_stream);
  index_of_[id] = index;
  live_.emplace(index, Live{id, std::move(params), sampler, 0, {}, {}});
}

void Engine::Finish(int64_t index, FinishReason reason, std::vector<RequestOutput>& out,
                    const std::string& error) {
  const auto it = live_.find(index);
  RequestOutput o;
  o.request_id = it->second.id;
  o.num_prompt_tokens = static_cast<int64_t>(it->second.params.prompt.size());
  o.finished = true;
  o.finish_reason = reason;
  o.error = error;
  out.push_back(std::move(o));
  index_of_.erase(it->second.id);
  live_.erase(it);
}

void Engine::Abort(uint64_t id) {
  const auto it = index_of_.find(id);
  if (it == index_of_.end()) return;
  scheduler_->Abort(it->second);
  Finish(it->second, FinishReason::kAbort, pending_);
}

bool Engine::HasWork() const { return !live_.empty() || !pending_.empty() || inflight_; }

EngineStats Engine::stats() const {
  EngineStats s;
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.kv_blocks_used = cache_->num_used_blocks();
  s.kv_blocks_total = cache_->shape().num_blocks;
  s.num_preemptions = scheduler_->num_preemptions();
  s.steps = steps_;
  s.kv_held = static_cast<int64_t>(held_.size()) + staged_.count();
  return s;
}

std::vector<RequestOutput> Engine::Step() {
  std::vector<RequestOutput> out = std::move(pending_);
  pending_.clear();
  ExpireHeldKv();
  const auto start = std::chrono::steady_clock::now();
  if (!inflight_) {
    if (!scheduler_->HasWork()) return out;
    StepPlan plan = scheduler_->Schedule();
    AFD_CHECK(!plan.empty(), "scheduler: work left but nothing scheduled");
    inflight_ = Launch(std::move(plan));
  }
  // Asynchronous scheduling: while the step in flight runs on the device, the next one (pure
  // decodes, ids from the device) is planned and launched; then the first one's results are
  // read back and handed out. Not after a step with prompt tokens: the launch after it may
  // capture a CUDA graph, which waits for the device, and its time would count as the
  // prefill's (each call's time is its completed step's).
  std::optional<Launched> next;
  if (async_ && inflight_->ticket >= 0 && inflight_->plan.num_prefill_tokens == 0) {
    const StepPlan& plan = inflight_->plan;
    std::vector<char> finishing(plan.seqs.size(), 1);
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const auto it = live_.find(plan.seqs[i].request);
      if (it == live_.end()) continue;  // aborted since: not running any more
      const RequestParams& p = it->second.params;
      finishing[i] =
          plan.seqs[i].sample && (p.max_tokens == 0 || it->second.generated + 1 >= p.max_tokens);
    }
    if (std::optional<StepPlan> ahead = scheduler_->ScheduleAhead(plan, finishing)) {
      ahead->batch.ids_from = inflight_->ids_t;
      next = Launch(std::move(*ahead));
      ++gen_stats_.ahead_steps;
    }
  }
  Launched done = std::move(*inflight_);
  inflight_ = std::move(next);
  Complete(done, out, start);
  return out;
}

Engine::Launched Engine::Launch(StepPlan plan) {
  Launched L;
  L.plan = std::move(plan);
  gen_stats_.peak_kv_blocks = std::max(gen_stats_.peak_kv_blocks, cache_->num_used_blocks());
  kernels::Backend& backend = model_.backend();
  const int64_t vocab = model_.config().vocab_size;
  ws_.Reset();
  L.logits = runner_.Forward(L.plan.batch, *cache_, ws_);  // [m, vocab]
  const int64_t m = L.logits.dim(0);
  L.m = m;
  const std::vector<ScheduledSeq>& seqs = L.plan.seqs;
  L.ids.assign(m, 0);
  L.lps.assign(m, 0.0f);
  L.tops.assign(m, {});
  if (m == 0) {
    runner_.StepEnqueued();
    return L;
  }

  // Sample every sequence's last logits row when it completes its tokens; other rows (prompt
  // positions) stay greedy and unused.
  std::vector<kernels::SampleRow> rows(m);
  std::vector<int32_t> targets(m, 0);
  std::vector<char> sampled_row(m, 0);
  std::vector<int64_t> top_k(m, 0);
  bool any_logprobs = false, host_logits = false;
  for (const ScheduledSeq& e : seqs) {
    Live& live = live_.at(e.request);
    const RequestParams& p = live.params;
    if (e.sample) rows[e.first_logits_row + e.num_logits_rows - 1] = live.sampler.NextRow();
    // Log-probabilities at the sampled ids, and at the next prompt token for prompt rows --
    // only when a request of the step asks for them.
    any_logprobs |= p.logprobs >= 0 || p.prompt_logprobs >= 0 || p.keep_prompt_logits;
    host_logits |= p.keep_prompt_logits;
    for (int64_t r = 0; r < e.num_logits_rows; ++r) {
      const int64_t row = e.first_logits_row + r;
      const bool sampled = e.sample && r + 1 == e.num_logits_rows;
      sampled_row[row] = sampled;
      if (!sampled) targets[row] = p.prompt[e.start + r + 1];
      top_k[row] = sampled ? std::max(p.logprobs, 0) : std::max(p.prompt_logprobs, 0);
      host_logits |= top_k[row] > 0;
    }
  }
  const bool every_row_sampled =
      std::all_of(sampled_row.begin(), sampled_row.end(), [](char c) { return c != 0; });
  if (every_row_sampled && !host_logits) {
    // A decode step: ids and log-probabilities (at the sampled ids, already on the device: no
    // upload) come back in one copy that does not wait for the steps launched after it; the
    // ids stay on the device for a next step planned before they reach the host.
    if (sampled_.numel() < 2 * m) {  // grows only when no step is in flight (ahead: m shrinks)
      std::shared_ptr<void> mem = backend.Allocate(2 * m * sizeof(int32_t));
      sampled_ = Tensor(mem.get(), DType::kI32, {2 * m}, backend.device(), mem);
    }
    const Tensor both = sampled_.Rows(0, 2 * m);
    L.ids_t = both.Rows(0, m);
    const Tensor lp_t(static_cast<char*>(both.data()) + m * sizeof(int32_t), DType::kF32, {m},
                      both.device(), both.owner());
    backend.Sample(L.logits, rows, L.ids_t);
    if (any_logprobs) backend.LogSoftmaxAt(L.logits, L.ids_t, lp_t);
    L.ticket = backend.StartCopyToHost(any_logprobs ? both : L.ids_t);
    L.with_logprobs = any_logprobs;
    runner_.StepEnqueued();
    return L;
  }
  // Prompt rows, top log-probabilities or prompt logits: read at once (nothing is launched
  // before this step's results are taken).
  const Tensor ids_t = ws_.Take(DType::kI32, {m});
  backend.Sample(L.logits, rows, ids_t);
  backend.CopyToHost(L.ids.data(), ids_t);
  for (int64_t r = 0; r < m; ++r) {
    if (sampled_row[r]) targets[r] = L.ids[r];
  }
  if (any_logprobs) {
    const Tensor targets_t = ws_.Take(DType::kI32, {m});
    backend.CopyToDevice(targets_t, targets.data());
    const Tensor lp_t = ws_.Take(DType::kF32, {m});
    backend.LogSoftmaxAt(L.logits, targets_t, lp_t);
    backend.CopyToHost(L.lps.data(), lp_t);
  }
  // The most likely tokens where asked: the row on the host, log-softmax as the CPU reference
  // computes it (so the token's own value matches its entry in the list).
  std::vector<float> row;  // a vocabulary's worth (400 KB for DeepSeek): only when asked
  for (int64_t r = 0; r < m; ++r) {
    if (top_k[r] == 0) continue;
    row.resize(vocab);
    backend.CopyToHost(row.data(), L.logits.Rows(r, 1));
    const double log_sum = kernels::HostLogSumExp(row.data(), vocab);
    L.tops[r] = TopK(row, top_k[r], log_sum);
    L.lps[r] = static_cast<float>(row[targets[r]] - log_sum);
  }
  runner_.StepEnqueued();
  return L;
}

void Engine::Complete(Launched& L, std::vector<RequestOutput>& out,
                      std::chrono::steady_clock::time_point start) {
  kernels::Backend& backend = model_.backend();
  const int64_t vocab = model_.config().vocab_size, m = L.m;
  if (L.ticket >= 0) {
    std::vector<int32_t> back(L.with_logprobs ? 2 * m : m);
    backend.FinishCopyToHost(L.ticket, back.data());
    L.ticket = -1;
    std::copy(back.begin(), back.begin() + m, L.ids.begin());
    if (L.with_logprobs) std::memcpy(L.lps.data(), back.data() + m, m * sizeof(float));
  }
  const StepPlan& plan = L.plan;
  const auto& eos = model_.config().eos_token_ids;
  std::vector<int32_t> next(plan.seqs.size(), 0);
  std::vector<char> finished(plan.seqs.size(), Scheduler::kContinues);
  std::vector<int64_t> done;
  std::vector<std::pair<int64_t, size_t>> held_outputs;  // (request index, its output in out)
  int64_t gone_decodes = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& e = plan.seqs[i];
    const auto it = live_.find(e.request);
    if (it == live_.end()) {  // aborted, or finished by the step before this one ran ahead
      finished[i] = Scheduler::kGone;
      gone_decodes += !e.prefill;
      continue;
    }
    Live& live = it->second;
    const RequestParams& p = live.params;
    const int64_t t = static_cast<int64_t>(p.prompt.size());
    const bool want_prompt = p.prompt_logprobs >= 0 || p.keep_prompt_logits;
    if (e.first_prefill && e.prefill && want_prompt) {
      if (live.prompt_logprobs.empty()) {
        live.prompt_logprobs.resize(t);
        live.prompt_logprobs[0].logprob = std::nanf("");
        if (p.keep_prompt_logits) live.prompt_logits.resize(t * vocab);
      }
      for (int64_t r = 0; r < e.num_logits_rows; ++r) {
        const int64_t pos = e.start + r, row = e.first_logits_row + r;
        if (pos + 1 < t) live.prompt_logprobs[pos + 1] = {L.lps[row], L.tops[row], L.ids[row]};
        if (p.keep_prompt_logits) {  // a step read at once: its logits are still there
          backend.CopyToHost(live.prompt_logits.data() + pos * vocab, L.logits.Rows(row, 1));
        }
      }
    }
    if (!e.sample) continue;
    RequestOutput o;
    o.request_id = live.id;
    o.num_prompt_tokens = t;
    o.kv_imported = std::exchange(live.kv_imported, false);
    if (e.first_prefill) {
      if (p.prompt_logprobs >= 0) o.prompt_logprobs = std::move(live.prompt_logprobs);
      if (p.keep_prompt_logits) o.prompt_logits = std::move(live.prompt_logits);
    }
    if (p.max_tokens == 0) {
      o.finish_reason = FinishReason::kLength;
    } else {
      const int64_t last = e.first_logits_row + e.num_logits_rows - 1;
      const int32_t id = L.ids[last];
      o.token_ids.push_back(id);
      if (p.logprobs >= 0) o.logprobs.push_back({L.lps[last], std::move(L.tops[last])});
      ++live.generated;
      next[i] = id;
      const bool stop =
          (!p.ignore_eos && std::find(eos.begin(), eos.end(), id) != eos.end()) ||
          std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) != p.stop_token_ids.end();
      if (stop) {
        o.finish_reason = FinishReason::kStop;
        o.stop_token_id = id;
      } else if (live.generated >= p.max_tokens) {
        o.finish_reason = FinishReason::kLength;
      }
    }
    if (o.finish_reason != FinishReason::kNone) {
      o.finished = true;
      finished[i] = Scheduler::kFinished;
      done.push_back(e.request);
      if (p.hold_kv_s > 0) held_outputs.emplace_back(e.request, out.size());
    }
    out.push_back(std::move(o));
  }
  scheduler_->Update(plan, next, finished);
  for (const auto& [index, at] : held_outputs) {
    const std::optional<Scheduler::HeldCache> h = scheduler_->TakeHeld(index);
    if (!h) continue;
    RequestOutput& o = out[at];
    const auto hold = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(live_.at(index).params.hold_kv_s));
    const auto deadline = std::chrono::steady_clock::now() + hold;
    const kv::CacheShape& shape = cache_->shape();
    const int64_t bytes = shape.num_layers * h->positions * shape.row_width *
                          static_cast<int64_t>(DTypeSize(shape.dtype));
    o.kv_held = true;
    o.kv_positions = h->positions;
    o.kv_block_ids = cache_->block_table(h->cache_seq);  // (informative, as vLLM's block ids)
    if (!live_.at(index).params.hold_kv_on_device && staged_.Fits(bytes)) {
      // Staged in host memory: transfers need not wait for this thread, the blocks are free.
      staged_.Put(o.request_id, ReadRows(h->cache_seq, h->positions), deadline);
      cache_->Release(h->cache_seq);
    } else {
      held_[o.request_id] = {h->cache_seq, h->positions, deadline};
    }
  }
  for (int64_t index : done) {
    index_of_.erase(live_.at(index).id);
    live_.erase(index);
  }
  const int64_t decode_tokens = plan.num_decode_tokens - gone_decodes;
  if (plan.num_prefill_tokens == 0 && decode_tokens == 0) return;  // every result discarded
  ++steps_;
  const double seconds = Seconds(start);
  GenerationStats& st = gen_stats_;
  if (plan.num_prefill_tokens == 0) {
    st.decode_tokens += decode_tokens;
    ++st.decode_steps;
    st.decode_seconds += seconds;
    if (st.decode_steps > GenerationStats::kWarmDecodeSteps) {
      st.steady_decode_tokens += decode_tokens;
      ++st.steady_decode_steps;
      st.steady_decode_seconds += seconds;
    }
  } else if (decode_tokens == 0) {
    st.prefill_tokens += plan.num_prefill_tokens;
    st.prefill_seconds += seconds;
  } else {
    ++st.mixed_steps;
    st.mixed_prefill_tokens += plan.num_prefill_tokens;
    st.mixed_decode_tokens += decode_tokens;
    st.mixed_seconds += seconds;
  }
  st.preemptions = scheduler_->num_preemptions();
}

}  // namespace afd::runtime

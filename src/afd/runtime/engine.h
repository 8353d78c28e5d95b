// The serving engine: continuous batching of requests that arrive and leave at any time, over
// one StepRunner (the model in process, or the AFD attention role) and one paged latent cache.
// Each Step() schedules (runtime/scheduler.h: decodes, prompt chunks, admissions, preemption),
// runs one forward pass, samples every sequence that completed its tokens (backend Sample op
// with the sequence's own random stream, so results do not depend on batching), and returns
// what each request produced. Requests stop at max_tokens, at the model's EOS (unless
// ignore_eos) or at one of their stop_token_ids; an abort or a bad request ends with an output
// saying so. `Generator` (runtime/generator.h) runs a fixed set of prompts through it.
// Thread safety: none; one thread owns an engine (server/ puts it behind a queue).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "afd/kv/paged_cache.h"
#include "afd/model/model.h"
#include "afd/runtime/held_kv.h"
#include "afd/runtime/request.h"
#include "afd/runtime/sampler.h"
#include "afd/runtime/scheduler.h"
#include "afd/runtime/step_runner.h"

namespace afd::runtime {

// EngineOptions::async_scheduling.
enum class AsyncScheduling {
  kAuto,  // on where the backend runs asynchronously (CUDA), where the host's work can overlap
  kOn,    // also on the CPU (where the next step's forward runs before this one's outputs are
          // handed out: the same outputs, one step later; for tests)
  kOff,
};

struct EngineOptions {
  int64_t max_num_seqs = 0;            // running sequences at most; 0: no limit
  int64_t max_num_batched_tokens = 0;  // tokens per step at most; 0: no limit
  bool chunked_prefill = false;        // needs max_num_batched_tokens > 0
  int64_t num_kv_blocks = 0;           // cache blocks (kv::kDefaultBlockSize tokens); > 0
  int64_t max_model_len = 0;           // prompt + new tokens at most; 0: the model's limit
  // Plan and launch a step of pure decodes before the previous step's ids reach the host (its
  // ids go from the device's samples straight into the step's inputs), so that the host's
  // work of a step (results, stop checks, scheduling, uploads) overlaps the device's. The same
  // outputs either way; only with a runner that takes ids from the device
  // (StepRunner::TakesDeviceIds). vLLM's --async-scheduling.
  AsyncScheduling async_scheduling = AsyncScheduling::kAuto;
  // Host memory for the rows of finished prefill-leg requests (hold_kv_s > 0): a request's rows
  // are copied out when it finishes, and its blocks freed, while the staged rows stay within
  // this many bytes (HeldKvStore); past it they stay in the cache's blocks until released.
  // 4 GiB, as vLLM's CPU KV space default.
  int64_t kv_stage_bytes = int64_t{4} << 30;
};

// Wall time and tokens by kind of step, and the cache's use.
struct GenerationStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  int64_t decode_tokens = 0;  // tokens fed through decode-only steps
  int64_t decode_steps = 0;
  double decode_seconds = 0.0;
  // The decode-only steps after the engine's first kWarmDecodeSteps: without one-time costs
  // (first kernel and library use, CUDA graph capture), for benchmarks.
  static constexpr int64_t kWarmDecodeSteps = 2;
  int64_t steady_decode_tokens = 0;
  int64_t steady_decode_steps = 0;
  double steady_decode_seconds = 0.0;
  // Steps with both prefill and decode tokens (continuous batching): their tokens and time.
  int64_t mixed_steps = 0;
  int64_t mixed_prefill_tokens = 0;
  int64_t mixed_decode_tokens = 0;
  double mixed_seconds = 0.0;
  int64_t preemptions = 0;  // sequences preempted (and recomputed) for lack of KV blocks
  // Steps launched before the previous step's results were read (asynchronous scheduling).
  int64_t ahead_steps = 0;
  int64_t kv_blocks = 0;       // blocks of the cache
  int64_t peak_kv_blocks = 0;  // most blocks in use at once
};

class Engine {
 public:
  // `model` and `runner` must outlive the engine. Throws afd::Error for bad options.
  Engine(const model::MoeModel& model, StepRunner& runner, const EngineOptions& options);
  ~Engine();

  // Queues a request under `id` (unique among live requests). Bad parameters (empty prompt,
  // ids outside the vocabulary, prompt + max_tokens over max_model_len, a prompt larger than
  // the cache, bad sampling values) end it at the next Step with an error output.
  void Add(uint64_t id, RequestParams params);
  // Ends a live request at the next Step (output with kAbort) and frees its blocks; unknown
  // ids are ignored.
  void Abort(uint64_t id);
  // True while a request is live, an output is pending or a step launched ahead is unread.
  bool HasWork() const;
  // True when the next Step runs a forward pass (a request is live), false when it only
  // returns pending outputs (the AFD attention role then runs an idle step instead).
  bool HasScheduledWork() const { return !live_.empty(); }
  // True when a step launched ahead is in flight: the next Step completes it (and may launch
  // another before reading it).
  bool HasStepInFlight() const { return inflight_.has_value(); }
  // Runs one step when anything is scheduled; returns every output produced (possibly none).
  std::vector<RequestOutput> Step();

  // KV transfers (prefill/decode disaggregation). The cache rows a finished request with
  // hold_kv_s > 0 keeps: staged ones at once, those left in the cache's blocks read back (waits
  // for the device). Throws afd::Error naming the request when it holds none (unknown, released
  // or expired).
  // device_ok: the consumer reads device rows over CUDA IPC (KvRows::device): rows left in the
  // cache's blocks of a backend with IPC are described, not copied (they stay held until
  // ReleaseHeldKv or their timeout).
  std::shared_ptr<const KvRows> ExportHeldKv(uint64_t id, bool device_ok = false);
  // Frees a held request's rows (after the consumer read them); unknown ids are ignored.
  void ReleaseHeldKv(uint64_t id);
  // The staged rows, for transfers on other threads (thread-safe; rows still in the cache's
  // blocks are not in it: those need ExportHeldKv on the engine's thread).
  HeldKvStore& staged_kv() { return staged_; }
  // The cache's row layout: what an imported KvRows must match.
  int64_t kv_row_width() const { return cache_->shape().row_width; }
  DType kv_dtype() const { return cache_->shape().dtype; }

  EngineStats stats() const;
  const GenerationStats& generation_stats() const { return gen_stats_; }
  int64_t max_model_len() const { return max_model_len_; }

 private:
  struct Live {
    uint64_t id = 0;
    RequestParams params;
    Sampler sampler;
    int64_t generated = 0;
    std::vector<TokenLogprobs> prompt_logprobs;  // filled over the first prefill's chunks
    std::vector<float> prompt_logits;            // [T, vocab] with keep_prompt_logits
    bool kv_imported = false;                    // rows imported, not yet told in an output
  };
  // A step launched on the device, its results not yet handed out.
  struct Launched {
    StepPlan plan;
    int64_t m = 0;  // logits rows
    Tensor logits;  // [m, vocab]: read only for a step whose results were read at once
    // ticket >= 0: ids (and log-probabilities with with_logprobs) are still being copied back
    // (Backend::StartCopyToHost); ids_t is where the device keeps the ids. Else ids, lps and
    // tops are read.
    int64_t ticket = -1;
    bool with_logprobs = false;
    Tensor ids_t;
    std::vector<int32_t> ids;  // [m] by logits row
    std::vector<float> lps;    // [m]
    std::vector<std::vector<TopLogprob>> tops;
  };
  // Runs the planned step's forward and sampling; reads the results at once unless they are
  // only ids and log-probabilities at them (then copied back behind later steps' launches).
  Launched Launch(StepPlan plan);
  // Takes a launched step's results: outputs, stop checks, scheduler update, stats (the step's
  // wall time: the Step call's, from `start`, the next step's launch included).
  void Complete(Launched& step, std::vector<RequestOutput>& out,
                std::chrono::steady_clock::time_point start);
  // Empty when fine, else why the request cannot run.
  std::string Check(const RequestParams& p) const;
  // The import hook (Scheduler::SetImportHook): request `index`'s imported rows into cache
  // sequence `seq`.
  void ImportRows(int64_t index, int64_t seq, int64_t cached);
  // Frees the held rows whose timeout passed.
  void ExpireHeldKv();
  // Cache sequence `seq`'s first `positions` rows of every layer, read back (waits for the device).
  std::shared_ptr<const KvRows> ReadRows(int64_t cache_seq, int64_t positions) const;
  struct Held {
    int64_t cache_seq = -1;
    int64_t positions = 0;
    std::chrono::steady_clock::time_point deadline;
  };
  std::map<uint64_t, Held> held_;  // in the cache's blocks, by request id
  HeldKvStore staged_;             // copied out of the cache
  void Finish(int64_t index, FinishReason reason, std::vector<RequestOutput>& out,
              const std::string& error = {});

  const model::MoeModel& model_;
  StepRunner& runner_;
  int64_t max_model_len_ = 0;
  std::unique_ptr<kv::PagedKvCache> cache_;
  std::string cache_ipc_handle_;  // of cache_'s storage (ExportHeldKv of device rows), once
  std::unique_ptr<Scheduler> scheduler_;
  Workspace ws_;
  int64_t next_index_ = 0;                // scheduler request index of the next Add
  std::map<int64_t, Live> live_;          // by scheduler index
  std::map<uint64_t, int64_t> index_of_;  // request id -> scheduler index
  std::vector<RequestOutput> pending_;    // outputs decided outside a step (errors, aborts)
  GenerationStats gen_stats_;
  int64_t steps_ = 0;
  bool async_ = false;                // EngineOptions::async_scheduling, with a runner for it
  std::optional<Launched> inflight_;  // launched, results not yet taken
  Tensor sampled_;                    // [ids | log-probabilities] of launched steps, on the device
};

}  // namespace afd::runtime

// One request of the serving engine (runtime/engine.h) and what a step produces for it. These
// are the types the OpenAI frontend (server/) and the attention replicas (deploy/) exchange.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afd/runtime/sampler.h"
#include "afd/tensor/tensor.h"

namespace afd::runtime {

// The cache rows of one sequence's first `positions` positions in every layer: what a KV
// transfer carries from a prefill instance to a decode instance (prefill/decode
// disaggregation). bytes: [num_layers][positions][row_width] values of dtype (the cache's).
// With `device` set, the rows are not in `bytes` but left in the producer's GPU cache, read over
// CUDA IPC (a consumer on the producer's host, the cuda_ipc KV transport).
struct KvDeviceRows {
  std::string ipc_handle;  // of the producer's cache allocation: [num_layers, num_slots, row_width]
  int64_t num_slots = 0;   // slots per layer (blocks x block_size)
  int64_t block_size = 0;  // the producer's
  std::vector<int32_t> blocks;  // the blocks that hold positions [0, positions), in order
};

struct KvRows {
  int64_t num_layers = 0;
  int64_t row_width = 0;
  int64_t positions = 0;
  DType dtype = DType::kF32;
  std::vector<char> bytes;
  std::optional<KvDeviceRows> device;
  // Device rows: the producer frees them when the last copy of this token goes (the consumer
  // has copied them into its cache, or gave the request up): see runtime::KvReleaseToken.
  std::shared_ptr<void> release_token;
  int64_t expected_bytes() const {
    return num_layers * positions * row_width * static_cast<int64_t>(DTypeSize(dtype));
  }
};

// What a consumer expects of imported rows: the model (a fingerprint both sides compute the same
// way, pd::KvModelFingerprint) and the cache's row layout.
struct KvLayout {
  std::string model;
  int64_t num_layers = 0;
  int64_t row_width = 0;
  DType dtype = DType::kF32;
};

// One sequence to generate (an OpenAI request with n > 1 is n of these).
struct RequestParams {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;  // new tokens at most (>= 1)
  // Sampling; `sampling.seed` seeds the sequence's random stream together with sampler_stream
  // (an OpenAI request with a seed and n > 1 gives choice i the stream i).
  SamplingParams sampling;
  int64_t sampler_stream = 0;
  std::vector<int32_t> stop_token_ids;  // finish (reason "stop") after emitting one of these
  bool ignore_eos = false;              // else the model's EOS ids stop it too
  // -1: none. k >= 0: every output token's log-probability plus the k most likely tokens.
  int32_t logprobs = -1;
  // -1: none. k >= 0: log-probabilities of the prompt tokens (the first is undefined) plus the
  // k most likely tokens at each prompt position (OpenAI `echo` with `logprobs`).
  int32_t prompt_logprobs = -1;
  // The raw logits of every prompt position on the first output (`afd run --dump-logits`).
  bool keep_prompt_logits = false;
  // > 0: a prefill instance's request (a KV producer): when it finishes, its cache rows stay
  // held for Engine::ExportHeldKv until Engine::ReleaseHeldKv or for this many seconds (vLLM's
  // VLLM_NIXL_ABORT_REQUEST_TIMEOUT: 480 s); 0: freed when it finishes.
  double hold_kv_s = 0;
  // With hold_kv_s: keep the rows in the cache's blocks (for a consumer that reads them over
  // CUDA IPC) rather than staging them in host memory.
  bool hold_kv_on_device = false;
  // A decode instance's request (a KV consumer): the cache rows of its first prompt positions,
  // computed elsewhere (at most prompt size - 1 are used: the last prompt token is computed
  // here and gives the first output token). Not with prompt log-probabilities.
  std::shared_ptr<const KvRows> imported_kv;
};

struct TopLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// The log-probability of one token (of the model's distribution, log_softmax of the raw
// logits, whatever the sampling parameters) and the `k` most likely tokens at that position,
// most likely first (ties: lower id first).
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<TopLogprob> top;
  // A prompt position's most likely token (the greedy argmax, first maximum; -1 where unknown):
  // the top-1 of the fidelity method (tools/fidelity.py), without copying the row to the host.
  int32_t argmax = -1;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* FinishReasonName(FinishReason r);  // "", "stop", "length", "abort", "error"

// What one engine step produced for one request: its new tokens (one per step), and on the
// last output finished = true with the reason.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;  // parallel to token_ids when params.logprobs >= 0
  // With params.prompt_logprobs >= 0, on the request's first output: one per prompt token
  // ([0].logprob is NaN, [0].top empty).
  std::vector<TokenLogprobs> prompt_logprobs;
  std::vector<float> prompt_logits;  // [T, vocab] with params.keep_prompt_logits, first output
  int64_t num_prompt_tokens = 0;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;  // the EOS or stop token that finished it (kStop), else -1
  std::string error;           // kError: why
  // kError for the request's own input (Engine::Check: an empty prompt, a token id outside the
  // vocabulary, more tokens than the model or the cache holds...): nothing ran, and the API
  // answers 400, not 500.
  bool rejected = false;
  // The final output of a request with hold_kv_s > 0: its cache rows are held (kv_positions of
  // them, in the blocks kv_block_ids) for Engine::ExportHeldKv.
  bool kv_held = false;
  int64_t kv_positions = 0;
  std::vector<int32_t> kv_block_ids;
  // The first output of a request that imported KV rows: they are in this engine's cache now
  // (a consumer lets the producer free device rows it read over CUDA IPC).
  bool kv_imported = false;

  // The final output of a request that failed: reason kError, `why`.
  static RequestOutput Failed(uint64_t id, std::string why) {
    RequestOutput o;
    o.request_id = id;
    o.finished = true;
    o.finish_reason = FinishReason::kError;
    o.error = std::move(why);
    return o;
  }
  // The final output of a request refused for its input: Failed, and rejected.
  static RequestOutput Rejected(uint64_t id, std::string why) {
    RequestOutput o = Failed(id, std::move(why));
    o.rejected = true;
    return o;
  }
};

// Load and cache occupancy of one engine (one attention DP replica).
struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t num_preemptions = 0;  // since start
  int64_t steps = 0;            // since start
  int64_t kv_held = 0;          // finished requests whose cache rows are held for a transfer
};

}  // namespace afd::runtime

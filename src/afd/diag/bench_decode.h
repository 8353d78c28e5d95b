// `afd bench decode`: decode speed of one process at several batch sizes, against the memory
// floor. For each batch size B: B random prompts of `context` tokens are prefilled (together,
// or in waves of prefill_tokens_per_step),
// then kWarmupSteps (2) untimed decode steps (the first captures the CUDA graph) and `steps` timed
// decode steps run (every sequence one token per step); the time per decode step
// is compared with the bytes a step must read -- the weights it uses (everything but the
// routed experts, plus the routed experts the batch touches: E·(1 - (1 - k/E)^B) per MoE layer
// in expectation under uniform routing) and the latent cache of every sequence -- divided by
// the copy bandwidth measured on this device at start.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "afd/diag/kernel_trace_summary.h"
#include "afd/kernels/backend.h"
#include "afd/model/model.h"
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/runtime/engine.h"

namespace afd::diag {

struct BenchDecodeOptions {
  std::vector<int64_t> batch_sizes = {1, 16, 64, 256};
  int64_t context = 128;  // prompt tokens of each sequence
  // Sequences of different lengths in one batch, as (count, prompt tokens) pairs (e.g. 1 of
  // 16,384 and 63 of 128: a long chat beside short ones): one row of that batch, instead of
  // batch_sizes x context. The floor counts each sequence's own cache.
  std::vector<std::pair<int64_t, int64_t>> context_mix;
  int64_t steps = 32;                // timed decode steps
  uint64_t seed = 0;                 // prompt ids
  runtime::CudaGraphOptions graphs;  // decode steps replay CUDA graphs unless graphs.enforce_eager
  // Per-op device time of the decode steps (eager: graphs are turned off while profiling) and,
  // apart, of the prefill (and mixed) steps.
  bool profile = false;
  // A kernel trace of the timed steps' CUDA graph replays (Backend::SetKernelTrace; CUDA only,
  // not with profile or eager steps): each kernel's time in the graph as it runs, and the part
  // no other kernel overlapped. The trace's own cost (CUPTI timestamps) is in that run's times.
  bool kernel_trace = false;
  // Prompt tokens prefilled per step at most (whole prompts, so at least one): a batch whose
  // prompts hold more is prefilled in waves, as a server would (batch 256 x context 1024 in one
  // step needs a ~40 GiB workspace); a prompt longer than this alone (context 131,072) is
  // prefilled in chunks of it (chunked prefill). The sequences of earlier waves decode during
  // the later ones (untimed mixed steps); the timed steps start once every sequence is running.
  int64_t prefill_tokens_per_step = 65536;
  runtime::AsyncScheduling async_scheduling = runtime::AsyncScheduling::kAuto;  // EngineOptions'
};

// Model FLOPs per token of a `context`-token prompt's prefill, averaged over its positions: 2 x
// the multiply-adds of the weight matrices a token goes through (absorbed MLA's W_k and W_v, the
// top-k routed and the shared experts, the router), of attention over its prefix (scores over
// kv_lora + rope dims, P·V over kv_lora) and of the LM head once per prompt.
double PrefillFlopsPerToken(const model::MoeModel& model, int64_t context);

struct BenchDecodeRow {
  int64_t batch = 0;
  double ms_per_step = 0;
  // Device time of a step: from its inputs' upload to the copy of its sampled ids back (CUDA
  // events; on the CPU wall time). ms_per_step - device_ms_per_step is the host time not
  // overlapped with the device (the device idle, waiting for the host's scheduling, result
  // handling and launches; with asynchronous scheduling they overlap the step before).
  double device_ms_per_step = 0;
  // max(0, ms_per_step - device_ms_per_step): with asynchronous scheduling a step's span starts
  // at its upload, while the step before it still runs, so the spans overlap and their sum can
  // exceed the wall time; the host then costs the step nothing (0, never a negative time).
  double host_ms_per_step() const { return std::max(0.0, ms_per_step - device_ms_per_step); }
  double tokens_per_s = 0;
  double bytes_per_step = 0;  // weights used + KV read
  double floor_ms = 0;        // bytes_per_step / copy bandwidth
  double prefill_tokens_per_s = 0;
  // prefill_tokens_per_s x PrefillFlopsPerToken: the prefill's model FLOP/s (issue 11 compares it
  // with the bf16 tensor-core peak).
  double prefill_tflops = 0;
  int64_t graph_steps = 0;  // decode steps replayed from a CUDA graph
  int64_t ahead_steps = 0;  // timed steps launched before the previous one's ids were read
  std::vector<kernels::OpTime> profile;          // per decode step (ms and calls divided by steps)
  std::vector<kernels::OpTime> prefill_profile;  // per prefill or mixed step
  int64_t prefill_steps = 0;
  KernelTraceSummary kernel_trace;  // options.kernel_trace: the timed steps' graph replays
};

struct BenchDecodeResult {
  std::string device;
  double copy_gb_per_s = 0;  // measured copy rate (read + write)
  std::vector<BenchDecodeRow> rows;
};

// Copy rate of the backend's memory: bytes read + written per second by a large device copy
// (the H200's 4.25 TB/s of the issues is measured this way), in GB/s.
double MeasureCopyBandwidth(kernels::Backend& backend);

// The model must hold every expert. Throws afd::Error for bad options.
BenchDecodeResult BenchDecode(const model::MoeModel& model, const BenchDecodeOptions& options);

}  // namespace afd::diag

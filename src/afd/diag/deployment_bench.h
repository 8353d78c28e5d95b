// `afd bench decode --topology xAyF`: the decode bench through an AFD deployment's rank
// processes on this host. Per batch size, `batch` prompts of `context` deterministic token ids
// generate 1 + kWarmDecodeSteps + `steps` tokens each (the first comes from the prefill); decode
// ms/step and tokens/s come from the attention ranks' own engine counters of their steady decode
// steps (after the warm-up ones: the slowest replica's ms/step; every replica's tokens over the
// slowest one's decode time).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "afd/deploy/deployment_run.h"

namespace afd::diag {

struct DeploymentBenchOptions {
  std::string model;
  int64_t num_layers = 0;  // 0: every layer
  std::vector<int64_t> batch_sizes;
  int64_t context = 128;
  int64_t steps = 32;
  uint64_t seed = 0;
  // The rank processes' flags for one batch size (model, generation and device flags): the
  // command line's business, so it is given here.
  std::function<std::vector<std::string>(int64_t batch)> worker_flags;
};

struct DeploymentBenchRow {
  int64_t batch = 0;
  double ms_per_step = 0, tokens_per_s = 0, prefill_tokens_per_s = 0;
};

// Throws afd::Error naming the option or the rank process that failed.
std::vector<DeploymentBenchRow> BenchDecodeOnDeployment(deploy::DeploymentSpec spec,
                                                        const DeploymentBenchOptions& options);

// `afd bench decode --topology --kernel-trace-csv CSV`: the rank processes of batch `batch`
// write {RankTracePrefix(CSV, batch)}{attention|ffn}{rank}.csv (WorkerOptions::kernel_trace_csv);
// MergeRankTraces then writes CSV: one line per kernel of every rank, for every batch,
// "batch,rank,stream,graph,launch,start_us,end_us,kernel" (rank "attention0", "ffn1", ...), the
// times from the batch's first kernel on any rank (the ranks share one clock), by start; the
// parts are removed. Throws afd::Error naming the file when a batch has no part or a line is
// malformed.
std::string RankTracePrefix(const std::string& csv, int64_t batch);
void MergeRankTraces(const std::string& csv, const std::vector<int64_t>& batches);

}  // namespace afd::diag

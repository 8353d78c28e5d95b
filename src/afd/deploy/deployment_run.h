// `afd run --topology xAyF`: every role process of an AFD deployment on this host (a free
// rendezvous port is picked), the prompts run through it, everything is shut down, and the
// results come back in prompt order -- the same results as the monolithic `afd run`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afd/deploy/launcher.h"

namespace afd::deploy {

struct DeploymentSpec {
  std::string topology;  // "3A2F"
  // > 0 instead of a topology: that many data-parallel ranks, each attention plus its share of
  // the routed experts, the MoE layers expert-parallel over all of them (vLLM's
  // --data-parallel-size N --enable-expert-parallel; roles/dp_ep_runner.h): no AFD.
  int expert_parallel_size = 0;
  int attention_dp = 0, attention_tp = 1;  // 0: dp = A / tp
  int ffn_dp = 0, ffn_tp = 1;              // 0: dp = F / tp
  std::string additional_config;           // optional extra afd fields (e.g. the gate placement)
  std::vector<std::string> worker_flags;   // model and generation flags, passed to every worker
  bool print_stats = false;                // per-rank steps and per-layer transfers to stderr
  bool show_rank_map = false;              // print the deployment's rank map to stderr
  bool cuda = false;  // the ranks run on GPUs (worker_flags carry --device cuda): async connector
  // With cuda: the CUDA device of every world rank (FFN ranks first, then attention ranks; with
  // expert_parallel_size, of each rank), passed to each as --cuda-device; empty: worker_flags
  // say (every rank on one device).
  std::vector<int> cuda_devices;
};

// One prompt's result: the JSON line of `afd run --json`, plus its ids for the text output.
struct DeploymentResult {
  std::string json_line;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
};

// GPUs a deployment's ranks run on: the distinct devices of spec.cuda_devices, 1 when every rank
// shares --cuda-device, 0 on the CPU (for tokens/s per GPU).
int NumGpus(const DeploymentSpec& spec);

// The worker flags that put a deployment's ranks on GPUs: --device cuda, --cuda-device
// `cuda_device` unless spec.cuda_devices places each rank, --dtype `dtype` when given.
std::vector<std::string> CudaWorkerFlags(const DeploymentSpec& spec, int cuda_device,
                                         const std::string& dtype);

// "xAyF", or "DP<N>+EP" for a data-parallel + expert-parallel deployment.
std::string DeploymentName(const DeploymentSpec& spec);

// The checks of a data-parallel + expert-parallel spec (expert_parallel_size > 0), for the
// command lines' input validation before anything starts: no topology or AFD options, 1..256
// ranks, --cuda-devices one distinct GPU per rank on cuda. Throws afd::Error naming the flag.
void CheckDataParallelExpertParallel(const DeploymentSpec& spec);

// The rank processes of the deployment (FFN ranks first, then attention ranks; or the
// data-parallel + expert-parallel ranks, labelled "attention+experts rank r"), their logs and
// stats files in `dir`, on a fresh rendezvous port. With `prompts_file` the attention ranks
// generate for it and write out<rank>.jsonl to `dir`; without, they serve (their specs are
// marked serves_engine). Checks the topology and config; throws afd::Error naming the flag.
std::vector<RankProcessSpec> DeploymentRankSpecs(const DeploymentSpec& spec, const std::string& dir,
                                                 const std::string& prompts_file);

// Throws afd::Error naming the process that failed (input errors before anything starts).
// attention_stats: when given, the stats object of every attention rank (steps, prefill and
// decode tokens and seconds, per-layer transfers), in rank order.
std::vector<DeploymentResult> RunDeployment(const DeploymentSpec& spec,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            std::vector<nlohmann::json>* attention_stats = nullptr);

}  // namespace afd::deploy

// `afd serve`: this host's ranks of one AFD role (one command per role and host, as the seed
// recipes start `vllm serve`), each an `afd worker` process, supervised until all end.
#pragma once

#include <string>
#include <vector>

#include "afd/deploy/launcher.h"
#include "afd/deploy/role_worker.h"

namespace afd::deploy {

struct ServeOptions {
  WorkerOptions base;       // validated; role, dp and tp come from here
  int dp_start = 0;         // first DP rank on this host
  int dp_local = 1;         // DP ranks on this host
  std::string log_dir;      // "" : a fresh temp directory
  std::string output_file;  // attention: merged results of this host's replicas
  // Flags every worker gets (model, generation, role and parallel sizes), as a command line.
  std::vector<std::string> worker_flags;
  // On cuda: the GPU of each of this host's ranks in rank order (--cuda-device of each; the
  // worker flags then carry none); empty: the worker flags' --cuda-device for all.
  std::vector<int> cuda_devices;
  double stop_grace_s = 10;  // after a stop signal, how long the ranks get to end
  // A headless attention host: the remote API server's engine listener (host:port) its
  // replicas serve (--engine-endpoint); "" otherwise (the local API server sets it).
  std::string engine_endpoint;
  // Written (its content: what joined) once every rank of this host has joined the deployment,
  // removed when they stop: a readiness signal for pods without an API (Kubernetes' exec probe
  // `test -e FILE`); "" for none.
  std::string ready_file;
};

// This host's rank processes (logs in the returned directory). Attention ranks without prompts
// serve requests: their specs are marked serves_engine.
std::vector<RankProcessSpec> ServeRankSpecs(const ServeOptions& options, std::string* log_dir);

// Starts the ranks, waits for them, merges the outputs. Throws afd::Error naming the rank
// that failed. SIGINT / SIGTERM (which the caller has blocked: BlockStopSignals) stop the
// ranks (SIGTERM, then SIGKILL after stop_grace_s); returns true when stopped so, with no
// output merged.
bool ServeRole(const ServeOptions& options);

}  // namespace afd::deploy

// One rank of a data-parallel + expert-parallel deployment (`afd run --data-parallel-size N
// --enable-expert-parallel`; roles/dp_ep_runner.h): the monolithic baseline of AFD. Rank 0
// hosts the rendezvous store on 127.0.0.1:port (these deployments are single-host); every rank
// joins one host group (counts, lockstep) and, on a GPU, an NCCL group for the MoE rows; loads
// everything but the other ranks' routed experts; generates for prompts i with i % N == rank;
// then takes part in the other ranks' steps until every rank is done. Serving: the rank is a
// replica of the frontend of `afd launch` (deploy/replica_serve.h), in the same lockstep.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "afd/deploy/kv_sizing.h"
#include "afd/model/loader.h"
#include "afd/runtime/engine.h"
#include "afd/runtime/generator.h"

namespace afd::deploy {

struct DpEpWorkerOptions {
  int rank = 0;
  int size = 1;
  int port = 0;            // rendezvous store on 127.0.0.1 (rank 0 listens)
  double timeout_s = 120;  // bound on forming the groups and on every collective wait
  // Bound on waiting for every rank to load its weights (a large checkpoint loads slowly and
  // unevenly); a rank that fails meanwhile ends the wait at once (its abort in the store).
  double load_timeout_s = 3600;
  std::string model;
  model::OpenOptions open;
  int cuda_device = -1;  // >= 0: the model runs on this GPU (MoE rows over NCCL)
  std::vector<std::vector<int32_t>> prompts;  // all prompts; this rank takes i % size == rank
  runtime::GenerationOptions generation;
  std::string output_file;  // {"index": i, "result": ...} lines of this rank's prompts
  std::string stats_file;   // optional: a JSON summary (steps, prefill and decode counters)
  // Serving (`afd launch --data-parallel-size N --enable-expert-parallel`): the frontend's
  // engine listener; requests come from there instead of `prompts` (deploy/replica_serve.h).
  std::string engine_endpoint;
  runtime::EngineOptions engine;  // num_kv_blocks 0: sized by `kv`
  KvSizing kv;
};

// Throws afd::Error on any failure, after publishing it in the store so that the other ranks
// (which then lose this one) report it as the cause; the launcher stops them.
void RunDpEpWorker(const DpEpWorkerOptions& options);

}  // namespace afd::deploy

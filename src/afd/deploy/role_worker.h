// One rank of an AFD deployment (`afd worker`): joins the world, loads the model and runs the
// attention role (generation over the P2P connector) or the FFN role (the worker loop).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "afd/config/afd_config.h"
#include "afd/deploy/kv_sizing.h"
#include "afd/model/loader.h"
#include "afd/roles/dbo_options.h"
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/runtime/engine.h"
#include "afd/runtime/generator.h"

namespace afd::deploy {

// What a rank prints once every rank of the deployment has joined (the `--ready-file` signal).
inline constexpr const char* kJoinedLine = "joined the deployment";

struct WorkerOptions {
  AfdConfig config;
  int role_rank = 0;
  int dp = 1;  // data-parallel size of this role's server
  int tp = 1;  // tensor-parallel size of this role's server
  std::string model;
  model::OpenOptions open;
  int cuda_device = -1;  // >= 0: the model runs on this GPU (async connector: CUDA IPC windows)
  // Attention role only:
  std::vector<std::vector<int32_t>> prompts;  // all prompts; replica d takes i % dp == d
  runtime::GenerationOptions generation;
  roles::DboOptions dbo;  // dual-batch overlap of the attention role
  // CUDA graphs of the async connector's roles on cuda (enforce_eager: none).
  runtime::CudaGraphOptions graphs;
  std::string output_file;  // TP rank 0 of each replica writes {"index": i, "result": ...} lines
  std::string stats_file;   // optional: a JSON summary of this rank (steps, per-layer transfers)
  // Optional (CUDA ranks): a kernel trace of everything this rank runs from joining to its
  // work's end, written to `{kernel_trace_csv}{attention|ffn}{role_rank}.csv`: one line per
  // kernel, "stream,graph,launch,start_ns,end_ns,kernel" (CUPTI's times: one clock for every
  // process of the host, so the ranks' files line up).
  std::string kernel_trace_csv;
  // Serving (attention role): the frontend's engine listener; requests come from there instead
  // of `prompts` (deploy/replica_serve.h).
  std::string engine_endpoint;
  runtime::EngineOptions engine;  // num_kv_blocks 0: sized by `kv`
  KvSizing kv;
};

// Throws afd::Error on any failure (after publishing an abort so the other ranks stop too).
void RunWorker(const WorkerOptions& options);

}  // namespace afd::deploy

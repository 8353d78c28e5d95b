#include "afd/deploy/role_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "afd/comm/afd_world.h"
#include "afd/common/error.h"
#include "afd/connector/async_connector.h"
#include "afd/connector/p2p_connector.h"
#include "afd/deploy/device_context.h"
#include "afd/deploy/rank_output.h"
#include "afd/deploy/replica_serve.h"
#include "afd/deploy/transport.h"
#include "afd/model/model_config.h"
#include "afd/roles/async_attention.h"
#include "afd/roles/async_ffn_worker.h"
#include "afd/roles/p2p_attention.h"
#include "afd/roles/p2p_ffn_worker.h"
#include "afd/topology/expert_range.h"
#include "afd/topology/parallel.h"

namespace afd::deploy {

namespace {

// direction: "A2F" (what an attention rank sent) or "F2A" (an FFN rank).
nlohmann::json TransferStats(const std::map<int, connector::LayerTransferStats>& stats,
                             const char* direction) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& [layer, s] : stats) {
    layers.push_back({{"layer", layer},
                      {"direction", direction},
                      {"messages", s.messages},
                      {"bytes", s.bytes},
                      {"tokens", s.tokens},
                      {"seconds", s.seconds}});
  }
  return layers;
}

// The most tokens one step of this attention rank can hold: what the asynchronous connector
// sizes its windows by. Without chunked prefill a whole sequence may run alone in a step even
// when it exceeds the token budget (runtime/scheduler.h).
int64_t AttentionTokenCap(const WorkerOptions& o, const model::ModelConfig& mc) {
  if (!o.engine_endpoint.empty()) {
    AFD_CHECK(o.engine.max_num_batched_tokens > 0,
              "{} sizes its windows by the tokens of a step: serving needs "
              "--max-num-batched-tokens > 0",
              o.config.connector);
    if (o.engine.chunked_prefill) return o.engine.max_num_batched_tokens;
    const int64_t len =
        o.engine.max_model_len > 0 ? o.engine.max_model_len : mc.max_position_embeddings;
    return std::max(o.engine.max_num_batched_tokens, len);
  }
  const runtime::GenerationOptions& g = o.generation;
  int64_t total = 1, longest = 1;
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    if (static_cast<int>(i % o.dp) == o.role_rank / o.tp) {
      const int64_t len = static_cast<int64_t>(o.prompts[i].size()) + g.max_tokens;
      total += len;
      longest = std::max(longest, len);
    }
  }
  // No limit: a step holds at most every token of this replica's sequences.
  if (g.max_num_batched_tokens <= 0) return total;
  if (g.chunked_prefill) return g.max_num_batched_tokens;
  return std::max(g.max_num_batched_tokens, longest);
}

// WorkerOptions::kernel_trace_csv's file of this rank.
void WriteKernelTrace(const std::string& path, const std::vector<kernels::KernelSpan>& spans) {
  std::string text = "stream,graph,launch,start_ns,end_ns,kernel\n";
  for (const kernels::KernelSpan& s : spans) {
    std::string name = s.name;
    for (size_t i = name.find('"'); i != std::string::npos; i = name.find('"', i + 2)) {
      name.insert(i, 1, '"');
    }
    text += fmt::format("{},{},{},{},{},\"{}\"\n", s.stream, s.graph, s.launch, s.start_ns,
                        s.end_ns, name);
  }
  WriteFileOrThrow(path, text);
}

// What this rank loads: attention everything but the routed experts (plus the routers when the
// gate runs there); an FFN rank the routers, the shared experts and its own routed experts.
model::LoadedModel LoadRoleModel(const WorkerOptions& o, int num_ranks) {
  model::OpenOptions open = o.open;
  if (o.config.role == Role::kAttention) {
    open.weights.load_moe = o.config.compute_gate_on_attention;
    open.weights.expert_begin = 0;
    open.weights.expert_end = 0;
  } else {
    const model::ModelConfig config = model::PeekModelConfig(o.model, o.open);
    const ExpertRange mine = ExpertRangeOf(config.n_routed_experts, num_ranks, o.role_rank);
    open.weights.load_attention = false;
    open.weights.expert_begin = mine.begin;
    open.weights.expert_end = mine.end;
  }
  return model::LoadModel(o.model, open, o.cuda_device);
}

// Both roles must run the same model layout, or their per-layer exchanges cannot pair up: the
// join request carries it and the store compares it across ranks.
comm::JoinRequest JoinRequestOf(const WorkerOptions& o, const model::ModelConfig& mc) {
  comm::JoinRequest request{o.config, o.role_rank, mc.hidden_size, DType::kF32, {}};
  std::string moe_layers;  // "0" for a dense layer, "1" for a MoE layer, layer by layer
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) moe_layers += mc.IsMoeLayer(l) ? '1' : '0';
  request.extra_fields = {{"model_type", mc.model_type_name()},
                          {"num_hidden_layers", std::to_string(mc.num_hidden_layers)},
                          {"moe_layers", moe_layers},
                          {"n_routed_experts", std::to_string(mc.n_routed_experts)},
                          {"num_experts_per_tok", std::to_string(mc.num_experts_per_tok)},
                          {"vocab_size", std::to_string(mc.vocab_size)}};
  return request;
}

// The rank's connector: exactly one is set.
struct Connectors {
  std::unique_ptr<connector::P2pConnector> p2p;
  std::unique_ptr<connector::AsyncConnector> async;
  const std::map<int, connector::LayerTransferStats>& stats() const {
    return async ? async->stats() : p2p->stats();
  }
};

// Puts the backend's wait check back to the world's abort alone when destroyed -- before the
// connector it also consults (declared after it).
struct WatchGuard {
  kernels::Backend* backend = nullptr;
  comm::AfdWorld* world = nullptr;
  ~WatchGuard() {
    if (backend == nullptr) return;
    backend->WatchWaits(world->config().afd_process_group_timeout_s,
                        [w = world] { w->CheckAbort(); });
  }
};

Connectors Connect(const WorkerOptions& o, const model::ModelConfig& mc, comm::AfdWorld& world,
                   kernels::Backend& backend, WatchGuard& guard) {
  const AfdConfig& c = o.config;
  Connectors conns;
  if (!c.is_async()) {
    conns.p2p = std::make_unique<connector::P2pConnector>(world);
    return conns;
  }
  connector::AsyncConnectorOptions ao;
  ao.token_cap = c.role == Role::kAttention ? AttentionTokenCap(o, mc) : 0;
  ao.topk = mc.num_experts_per_tok;
  ao.num_experts = mc.n_routed_experts;
  ao.row = {mc.hidden_size, DType::kF32};
  ao.cuda_device = o.cuda_device;
  if (c.async_options.device_flags) {
    if (o.cuda_device >= 0) {
      ao.cuda_stream = backend.stream().handle;
      ao.device_sequenced = true;
    } else {
      ao.inline_flags = true;
    }
  }
  conns.async = std::make_unique<connector::AsyncConnector>(world, ao);
  // A device wait that failed (a peer that exited or went silent, a wrong reply) ends the host's
  // wait for the stream at once, naming the peer.
  backend.WatchWaits(c.afd_process_group_timeout_s, [w = &world, conn = conns.async.get()] {
    w->CheckAbort();
    conn->CheckDevice();
  });
  guard.world = &world;
  guard.backend = &backend;
  return conns;
}

std::unique_ptr<runtime::ReplicaRunner> MakeAttentionRunner(const WorkerOptions& o,
                                                            const model::MoeModel& model,
                                                            comm::AfdWorld& world,
                                                            Connectors& conns) {
  if (conns.async) {
    return roles::MakeAsyncAttentionReplica(model, world, *conns.async, o.tp, o.dbo, o.graphs);
  }
  return roles::MakeP2pAttentionReplica(model, world, *conns.p2p, o.tp, o.dbo, o.graphs);
}

std::unique_ptr<roles::FfnRole> MakeFfnRole(const WorkerOptions& o, const model::MoeModel& model,
                                            comm::AfdWorld& world, Connectors& conns) {
  const bool graphs = !o.graphs.enforce_eager;
  if (conns.async) {
    return std::make_unique<roles::AsyncFfnWorker>(model, world, *conns.async, graphs);
  }
  return std::make_unique<roles::P2pFfnWorker>(model, world, *conns.p2p, graphs);
}

// The attention role's work: serving the frontend's requests (engine_endpoint), or generating
// this replica's share of the prompts then draining.
void RunAttention(const WorkerOptions& o, const model::MoeModel& model, comm::AfdWorld& world,
                  runtime::ReplicaRunner& runner, nlohmann::json& stats) {
  const int dp_rank = o.role_rank / o.tp, tp_rank = o.role_rank % o.tp;
  if (!o.engine_endpoint.empty()) {
    ReplicaServeOptions serve;
    serve.endpoint = o.engine_endpoint;
    serve.dp_rank = dp_rank;
    serve.tp = o.tp;
    serve.tp_rank = tp_rank;
    serve.engine =
        SizedServingEngine(model, o.engine, o.kv, fmt::format("attention rank {}", o.role_rank));
    ServeReplica(model, &world, runner, serve);
    stats["steps"] = runner.steps();
  } else {
    const PromptShare mine = ShareOfPrompts(o.prompts, o.dp, dp_rank);
    runtime::GenerationOptions gen = o.generation;
    gen.sampler_streams = mine.indices;  // sampling as in one process running every prompt
    std::vector<runtime::GenerationResult> results;
    runtime::GenerationStats gs;
    if (!mine.prompts.empty()) {
      runtime::Generator generator(model, runner);
      results = generator.Generate(mine.prompts, gen, &gs);
    }
    AddGenerationStats(gs, stats);
    // This replica's own steps; the P2P runner then runs empty lockstep steps until every
    // replica is done, the asynchronous one only announces its shutdown.
    const int64_t own_steps = runner.steps();
    runner.Drain();
    if (tp_rank == 0 && !o.output_file.empty()) {
      WriteFileOrThrow(o.output_file, ResultLines(mine.indices, results));
    }
    stats["steps"] = runner.steps();
    stats["drain_steps"] = stats["steps"].get<int64_t>() - own_steps;
    stats["prompts"] = mine.prompts.size();
  }
  stats["dbo_steps"] = runner.dbo_steps();
  stats["graph_steps"] = runner.graph_steps();
  stats["graph_captures"] = runner.num_captures();
}

void RunFfn(roles::FfnRole& ffn, nlohmann::json& stats) {
  stats["steps"] = ffn.Run();  // P2P: steps; async: work items
  for (const auto& [name, value] : ffn.Counters()) stats[name] = value;
  stats["experts"] = {ffn.experts().begin, ffn.experts().end};
}

}  // namespace

void RunWorker(const WorkerOptions& o) {
  const AfdConfig& c = o.config;
  const Role role = c.role;
  const int num_ranks = role == Role::kAttention ? c.num_attention_ranks : c.num_ffn_ranks;
  CheckRankRule(role, num_ranks, ParallelSizes{o.dp, 1, o.tp});
  CheckConnectorImplemented(c, o.cuda_device >= 0);
  // GPU ranks wait on the device for each other's writes (the async connector's wait kernels,
  // NCCL's). Under CUDA's lazy module loading a process's first launch of a kernel (or cuBLAS
  // routine) may wait for the device to be idle -- under MPS, behind a peer's kernel that
  // waits for this very process: the deployment stalls until that wait times out (seen on one
  // H200 under MPS: 2 starts of ~190 of 2A2F over the async connector, every rank spinning). So
  // every kernel loads when CUDA initializes, before the first step (unless the user chose).
  if (o.cuda_device >= 0) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  const auto start = std::chrono::steady_clock::now();
  model::LoadedModel loaded = LoadRoleModel(o, num_ranks);
  kernels::Backend& backend = *loaded.backend;
  const model::MoeModel& model = *loaded.model;
  // GPU ranks of the P2P connector: its data plane (and the FFN role's expert-parallel rows)
  // over NCCL on the backend's stream; the async connector brings its own windows.
  DeviceContext device;
  if (o.cuda_device >= 0 && c.is_p2p()) {
    const int world_rank = role == Role::kFfn ? o.role_rank : c.num_ffn_ranks + o.role_rank;
    device = MakeDeviceContext(o.cuda_device, world_rank, backend.stream().handle);
  }
  std::unique_ptr<comm::AfdWorld> world =
      comm::AfdWorld::Join(JoinRequestOf(o, model.config()), device.factory);
  // The line `afd serve --ready-file` waits for in every local rank's log.
  std::fprintf(stderr, "%s: %s\n", world->Describe(world->world_rank()).c_str(), kJoinedLine);
  // This rank's stream carries transfers with its peers (NCCL, or waits on their flags): a
  // peer that dies mid-transfer must not leave a wait for the device blocked for ever.
  backend.WatchWaits(c.afd_process_group_timeout_s, [w = world.get()] { w->CheckAbort(); });
  // Declared outside the try so that on failure the abort is published while the connections
  // are still open: peers then learn the cause before they see the connection drop. Destroyed
  // in reverse: the roles, the watch, then the connector.
  Connectors conns;
  WatchGuard watch_guard;
  std::unique_ptr<runtime::ReplicaRunner> runner;
  std::unique_ptr<roles::FfnRole> ffn;
  const std::string trace_path =
      o.kernel_trace_csv.empty()
          ? std::string()
          : fmt::format("{}{}{}.csv", o.kernel_trace_csv, RoleName(role), o.role_rank);
  try {
    if (!trace_path.empty()) backend.SetKernelTrace(true);
    nlohmann::json stats = {{"role", std::string(RoleName(role))},
                            {"role_rank", o.role_rank},
                            {"world_rank", world->world_rank()}};
    conns = Connect(o, model.config(), *world, backend, watch_guard);
    if (role == Role::kAttention) {
      runner = MakeAttentionRunner(o, model, *world, conns);
      RunAttention(o, model, *world, *runner, stats);
    } else {
      ffn = MakeFfnRole(o, model, *world, conns);
      RunFfn(*ffn, stats);
    }
    if (!trace_path.empty()) WriteKernelTrace(trace_path, backend.TakeKernelTrace());
    // Everyone finishes together, so a failure anywhere is reported everywhere.
    world->Barrier("worker-done");
    stats["seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats["transfers"] = TransferStats(conns.stats(), role == Role::kAttention ? "A2F" : "F2A");
    if (!o.stats_file.empty()) WriteFileOrThrow(o.stats_file, stats.dump() + "\n");
  } catch (const Error& e) {
    // What the asynchronous connector had sent and consumed when it failed (for the logs).
    if (conns.async) fmt::print(stderr, "{}\n", conns.async->DescribeState());
    // A rank that lost a peer usually lost it because that peer failed and said why: report
    // the root cause with our own error.
    if (std::optional<std::string> cause = world->AbortMessage()) {
      AFD_THROW("{} (the deployment was aborted: {})", e.what(), *cause);
    }
    world->Abort(fmt::format("{} rank {} failed: {}", RoleName(role), o.role_rank, e.what()));
    throw;
  }
}

}  // namespace afd::deploy

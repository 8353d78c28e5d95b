#include "afd/deploy/dp_ep_worker.h"

#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "afd/comm/join_secret.h"
#include "afd/comm/store.h"
#include "afd/comm/tcp_communicator.h"
#include "afd/common/error.h"
#include "afd/deploy/device_context.h"
#include "afd/deploy/rank_output.h"
#include "afd/deploy/replica_serve.h"
#include "afd/roles/dp_ep_runner.h"
#include "afd/topology/expert_range.h"
#include "afd/topology/topology.h"

namespace afd::deploy {

namespace {

constexpr const char* kAbortKey = "dp_ep/abort";
constexpr const char* kLoadedKey = "dp_ep/loaded";
constexpr const char* kAbortSeenKey = "dp_ep/abort_seen";  // ranks that read the abort

// The abort message a failed rank published, if any (nullopt also when the store is gone).
std::optional<std::string> AbortMessage(comm::Store& store) {
  try {
    return store.TryGet(kAbortKey);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Every rank has loaded its weights: waits up to `load_timeout_s` (loading a large checkpoint
// takes long, and unevenly), ending early when a rank published an abort.
void WaitForAllLoaded(comm::Store& store, int size, double load_timeout_s) {
  store.Add(kLoadedKey, 1);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(load_timeout_s);
  while (store.Add(kLoadedKey, 0) < size) {
    if (std::optional<std::string> cause = AbortMessage(store)) AFD_THROW("{}", *cause);
    AFD_CHECK(std::chrono::steady_clock::now() < deadline,
              "{} of {} data-parallel ranks loaded their weights within {} s",
              store.Add(kLoadedKey, 0), size, load_timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

void RunDpEpWorker(const DpEpWorkerOptions& o) {
  AFD_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size,
            "data-parallel rank {} of {}: out of range", o.rank, o.size);
  const auto start = std::chrono::steady_clock::now();
  const std::string host = "127.0.0.1";
  const std::optional<std::string> secret = comm::ResolveJoinSecret(host);
  std::unique_ptr<comm::TcpStoreServer> server;
  if (o.rank == 0) {
    comm::StoreServerOptions so;
    so.bind_host = host;
    so.port = o.port;
    so.secret = secret;
    server = std::make_unique<comm::TcpStoreServer>(so);
  }
  comm::TcpStoreClient store(host, o.port, o.timeout_s, secret);
  // The CPU group outlives the try: a rank that fails on its own publishes why before its peers
  // can see it leave, so a peer that then loses it finds the cause (not a race with it).
  std::unique_ptr<comm::Communicator> group;
  try {
    // This rank's weights: everything but the other ranks' routed experts.
    model::OpenOptions open = o.open;
    const model::ModelConfig config = model::PeekModelConfig(o.model, o.open);
    const ExpertRange experts = ExpertRangeOf(config.n_routed_experts, o.size, o.rank);
    open.weights.expert_begin = experts.begin;
    open.weights.expert_end = experts.end;
    model::LoadedModel loaded = model::LoadModel(o.model, open, o.cuda_device);
    const std::unique_ptr<kernels::Backend>& backend = loaded.backend;
    std::unique_ptr<model::MoeModel>& model = loaded.model;
    WaitForAllLoaded(store, o.size, o.load_timeout_s);

    comm::GroupSpec spec;
    spec.name = "dp_ep";
    spec.rank = o.rank;
    spec.size = o.size;
    for (int r = 0; r < o.size; ++r) spec.labels.push_back(fmt::format("data-parallel rank {}", r));
    spec.local_address = host;
    spec.timeout_s = o.timeout_s;
    spec.join_secret = secret;
    comm::PrefixStore group_store(store, "dp_ep");
    group = comm::TcpCommunicator::Create(group_store, spec);
    // On a GPU the MoE rows move between device buffers: an NCCL group on the model's stream.
    std::unique_ptr<comm::Communicator> rows;
    if (o.cuda_device >= 0) {
      const DeviceContext device =
          MakeDeviceContext(o.cuda_device, o.rank, backend->stream().handle);
      comm::GroupSpec rows_spec = spec;
      rows_spec.name = "afd_nccl_dp_ep";
      comm::PrefixStore rows_store(store, rows_spec.name);
      rows = device.factory(rows_store, rows_spec);
    }
    // The stream carries NCCL transfers with the other ranks: a wait for it is bounded and ends
    // when a rank has published an abort.
    backend->WatchWaits(o.timeout_s, [&store] {
      if (std::optional<std::string> cause = AbortMessage(store)) AFD_THROW("{}", *cause);
    });
    roles::DataParallelExpertParallelRunner runner(*model, *group, rows ? *rows : *group);

    const PromptShare mine = ShareOfPrompts(o.prompts, o.size, o.rank);
    std::vector<runtime::GenerationResult> results;
    runtime::GenerationStats gs;
    if (!o.engine_endpoint.empty()) {
      ReplicaServeOptions serve;
      serve.endpoint = o.engine_endpoint;
      serve.dp_rank = o.rank;
      serve.engine = SizedServingEngine(*model, o.engine, o.kv,
                                        fmt::format("attention+experts rank {}", o.rank));
      ServeReplica(*model, /*world=*/nullptr, runner, serve);
    } else {
      runtime::GenerationOptions gen = o.generation;
      gen.sampler_streams = mine.indices;  // sampling as in one process running every prompt
      if (!mine.prompts.empty()) {
        runtime::Generator generator(*model, runner);
        results = generator.Generate(mine.prompts, gen, &gs);
      }
      runner.Drain();
    }
    backend->Synchronize();  // a device error of the last steps surfaces here, not unseen
    if (!o.output_file.empty()) WriteFileOrThrow(o.output_file, ResultLines(mine.indices, results));
    group->Barrier();  // everyone finishes together (rank 0's store lives until then)
    if (!o.stats_file.empty()) {
      nlohmann::json stats = {
          {"role", "data_parallel_expert_parallel"},
          {"role_rank", o.rank},
          {"expert_range", {runner.moe().expert_begin(), runner.moe().expert_end()}},
          {"prompts", mine.prompts.size()},
          {"steps", runner.steps()},
          {"drain_steps", runner.empty_steps()},
          {"seconds",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
          {"transfers", nlohmann::json::array()}};
      AddGenerationStats(gs, stats);
      WriteFileOrThrow(o.stats_file, stats.dump() + "\n");
    }
  } catch (const Error& e) {
    // A rank that lost a peer lost it because that peer failed, and the peer said why before
    // leaving: report the root cause with our own error (the launcher names the failed rank).
    // A rank that failed on its own says why before its peers can see it leave.
    const std::optional<std::string> cause = AbortMessage(store);
    try {
      if (!cause) {
        store.Set(kAbortKey, fmt::format("attention+experts rank {} failed: {}", o.rank, e.what()));
      }
      group.reset();  // only now do the peers see this rank leave
      if (cause) store.Add(kAbortSeenKey, 1);
      // Rank 0 serves the store: it stays until every other rank that lost a peer has read why
      // (or 2 s, within the launcher's grace period), else they would find the store gone with
      // it, whichever rank failed.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (server && store.Add(kAbortSeenKey, 0) < o.size - 1 &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const Error&) {  // the store is gone with rank 0: nothing to tell the others
    }
    if (cause) AFD_THROW("{} (the deployment was aborted: {})", e.what(), *cause);
    throw;
  }
}

}  // namespace afd::deploy

#include "afd/deploy/dp_ep_worker.h"

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "afd/comm/join_secret.h"
#include "afd/comm/store.h"
#include "afd/comm/tcp_communicator.h"
#include "afd/common/error.h"
#include "afd/deploy/device_context.h"
#include "afd/deploy/result_json.h"
#include "afd/runtime/dp_ep_runner.h"
#include "afd/topology/topology.h"

namespace afd::deploy {

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

  // This rank's weights: everything but the other ranks' routed experts.
  model::OpenOptions open = o.open;
  const model::ModelConfig config = model::PeekModelConfig(o.model, o.open);
  open.weights.expert_begin = SplitOffset(config.n_routed_experts, o.size, o.rank);
  open.weights.expert_end = SplitOffset(config.n_routed_experts, o.size, o.rank + 1);
  const std::unique_ptr<kernels::Backend> backend =
      kernels::MakeBackend(o.cuda_device >= 0 ? Device::Cuda(o.cuda_device) : Device::Cpu());
  std::unique_ptr<model::DeepseekModel> model = model::OpenModel(o.model, open, *backend);

  comm::GroupSpec spec;
  spec.name = "dp_ep";
  spec.rank = o.rank;
  spec.size = o.size;
  for (int r = 0; r < o.size; ++r) spec.labels.push_back(fmt::format("data-parallel rank {}", r));
  spec.local_address = host;
  spec.timeout_s = o.timeout_s;
  spec.join_secret = secret;
  comm::PrefixStore group_store(store, "dp_ep");
  std::unique_ptr<comm::Communicator> group = comm::TcpCommunicator::Create(group_store, spec);
  // On a GPU the MoE rows move between device buffers: an NCCL group on the model's stream.
  std::unique_ptr<comm::Communicator> rows;
  if (o.cuda_device >= 0) {
    const DeviceContext device = MakeDeviceContext(o.cuda_device, o.rank, backend->stream().handle);
    comm::GroupSpec rows_spec = spec;
    rows_spec.name = "afd_nccl_dp_ep";
    comm::PrefixStore rows_store(store, rows_spec.name);
    rows = device.factory(rows_store, rows_spec);
  }
  runtime::DataParallelExpertParallelRunner runner(*model, *group, rows ? *rows : *group);

  std::vector<std::vector<int32_t>> mine;
  std::vector<int64_t> indices;
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    if (static_cast<int>(i % o.size) == o.rank) {
      mine.push_back(o.prompts[i]);
      indices.push_back(static_cast<int64_t>(i));
    }
  }
  runtime::GenerationOptions gen = o.generation;
  gen.sampler_streams = indices;  // sampling as in one process running every prompt
  std::vector<runtime::GenerationResult> results;
  runtime::GenerationStats gs;
  if (!mine.empty()) {
    runtime::Generator generator(*model, runner);
    results = generator.Generate(mine, gen, &gs);
  }
  const int64_t own_steps = runner.steps();
  runner.Drain();
  if (!o.output_file.empty()) {
    std::ofstream out(o.output_file, std::ios::trunc);
    for (size_t i = 0; i < results.size(); ++i) {
      out << fmt::format("{{\"index\": {}, \"result\": {}}}\n", indices[i],
                         ResultJsonLine(results[i]));
    }
    out.close();
    AFD_CHECK(out.good(), "cannot write {}", o.output_file);
  }
  group->Barrier();  // everyone finishes together (rank 0's store lives until then)
  if (!o.stats_file.empty()) {
    const nlohmann::json stats = {
        {"role", "data_parallel_expert_parallel"},
        {"role_rank", o.rank},
        {"expert_range", {runner.moe().expert_begin(), runner.moe().expert_end()}},
        {"prompts", mine.size()},
        {"steps", own_steps + runner.empty_steps()},
        {"drain_steps", runner.empty_steps()},
        {"prefill_tokens", gs.prefill_tokens},
        {"prefill_seconds", gs.prefill_seconds},
        {"decode_tokens", gs.decode_tokens},
        {"decode_steps", gs.decode_steps},
        {"decode_seconds", gs.decode_seconds},
        {"mixed_steps", gs.mixed_steps},
        {"mixed_seconds", gs.mixed_seconds},
        {"seconds",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
        {"transfers", nlohmann::json::array()}};
    std::ofstream out(o.stats_file, std::ios::trunc);
    out << stats.dump() << "\n";
    out.close();
    AFD_CHECK(out.good(), "cannot write {}", o.stats_file);
  }
}

}  // namespace afd::deploy

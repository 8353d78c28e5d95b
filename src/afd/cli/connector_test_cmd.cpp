// `afd connector-test`: flags of one role process of a P2P connector round trip, like
// nccl-tests; the run itself is diag::RunConnectorTest (diag/connector_check.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "afd/cli/commands.h"
#include "afd/common/error.h"
#include "afd/config/afd_config.h"
#include "afd/connector/control_plane.h"
#include "afd/diag/connector_check.h"

namespace afd::cli {

using diag::ConnectorTestArgs;
using Args = ConnectorTestArgs;

void AddConnectorTestCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "connector-test",
      "Run one role process of a P2P connector round trip (checks every row's origin), or "
      "--bench it. Start one process per rank with the same --additional-config.");
  auto args = std::make_shared<Args>();
  cmd->add_option("--additional-config", args->additional_config,
                  "JSON with an \"afd\" object (role, host, port, rank counts, connector)")
      ->required();
  cmd->add_option("--role-rank", args->role_rank, "This process's rank within its role")
      ->check(CLI::NonNegativeNumber)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--layers", args->layers, "MoE layers per step")->check(CLI::Range(1, 1000));
  cmd->add_option("--stages", args->stages, "Stages (micro-batches) per layer")
      ->check(CLI::Range(1, connector::kMaxStages));
  cmd->add_option("--steps", args->steps, "Steps")->check(CLI::Range(0, 1000000));
  cmd->add_option("--hidden", args->hidden, "Elements per row (>= 6)")
      ->check(CLI::Range(int64_t{6}, int64_t{1} << 20));
  cmd->add_option("--dtype", args->dtype, "Row dtype on the wire")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--max-rows", args->max_rows, "Largest per-rank row count in a stage")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--die-at-step", args->die_at_step,
                  "Kill this process (SIGKILL) at that step: for failure tests");
  cmd->add_option("--device", args->device,
                  "cpu: host rows over TCP; cuda: device rows over NCCL (CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--cuda-device", args->cuda_device,
                  "CUDA device of this rank (default: its world rank modulo the device count)");
  cmd->add_flag("--bench", args->bench, "Time round trips instead of checking rows");
  cmd->add_flag("--host-flags", args->host_flags,
                "Async connector on cuda: the host stores and polls the flags after a stream "
                "sync (default: the stream stores and awaits them)");
  cmd->add_option("--bench-rows", args->bench_rows, "Row counts to time, comma-separated");
  cmd->add_flag("--raw", args->raw,
                "With --bench on a P2P connector (1A1F): time the transport's own send/recv "
                "(ncclSend/ncclRecv with --device cuda, TCP otherwise) without the connector");
  cmd->add_option("--iters", args->iters, "Timed iterations per row count")
      ->check(CLI::Range(1, 100000));
  cmd->callback([args, &exit_code] {
    AfdConfig config;
    std::string who = "connector-test";
    try {
      config = ParseAfdConfig(args->additional_config);
    } catch (const Error& e) {
      std::cerr << "afd connector-test: invalid --additional-config: " << e.what() << "\n";
      exit_code = 2;
      return;
    }
    who = fmt::format("{} rank {}", RoleName(config.role), args->role_rank);
    try {
      std::cout << diag::RunConnectorTest(*args, config).dump() << std::endl;
      exit_code = 0;
    } catch (const Error& e) {
      std::cerr << "afd connector-test: " << who << ": error: " << e.what() << std::endl;
      exit_code = 1;
    }
  });
}

}  // namespace afd::cli

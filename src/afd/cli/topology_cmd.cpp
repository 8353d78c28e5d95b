#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "afd/cli/commands.h"
#include "afd/deploy/rank_map.h"
#include "afd/topology/topology.h"

namespace afd::cli {

void AddTopologyCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("topology",
                                 "Print the AFD world, subgroups and control plane of "
                                 "an xAyF deployment");
  struct Args {
    int attention = 0;
    int ffn = 0;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--attention,-a", args->attention, "Number of attention ranks (A)")
      ->required()
      ->check(CLI::Range(1, kMaxRanksPerRole));
  cmd->add_option("--ffn,-f", args->ffn, "Number of FFN ranks (F)")
      ->required()
      ->check(CLI::Range(1, kMaxRanksPerRole));
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->callback([args, &exit_code] {
    const Topology t(args->attention, args->ffn);
    std::cout << (args->json ? deploy::TopologyJson(t) + "\n" : deploy::TopologyText(t));
    exit_code = 0;
  });
}

}  // namespace afd::cli

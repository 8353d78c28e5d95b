// Subcommands of the `afd` binary. Each Add*Command registers a CLI11 subcommand whose callback
// stores the process exit code in `exit_code` (0 ok, 2 invalid input, 1 runtime failure).
// afd::Error thrown by a callback propagates to main, which prints it and exits 1.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace afd {
class Topology;

namespace cli {

void AddTopologyCommand(CLI::App& app, int& exit_code);
void AddConfigCommand(CLI::App& app, int& exit_code);
void AddConnectorTestCommand(CLI::App& app, int& exit_code);
// `afd run`: in-process generation with a DeepSeek-V2/V3 model (run_cmd.cpp).
void AddRunCommand(CLI::App& app, int& exit_code);
// `afd worker` (one rank) and `afd serve` (one role's ranks on this host) (worker_cmd.cpp).
void AddWorkerCommands(CLI::App& app, int& exit_code);
// `afd bench decode` and `afd bench serve` (bench_cmd.cpp).
void AddBenchCommand(CLI::App& app, int& exit_code);
// `afd tokenize`: JSON lines through a checkpoint's tokenizer and chat template (tokenize_cmd.cpp).
void AddTokenizeCommand(CLI::App& app, int& exit_code);
// `afd k8s`: Kubernetes manifests of a multi-pod deployment.
void AddK8sCommand(CLI::App& app, int& exit_code);
// `afd proxy`: prefill/decode disaggregation's endpoint (proxy_cmd.cpp).
void AddProxyCommand(CLI::App& app, int& exit_code);
// `afd quantize`: an FP8 copy of a checkpoint in DeepSeek-V3's format (quantize_cmd.cpp).
void AddQuantizeCommand(CLI::App& app, int& exit_code);

}  // namespace cli
}  // namespace afd

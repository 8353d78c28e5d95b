// The `afd` binary: parses the command line and dispatches to a subcommand in cli/.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "afd/cli/commands.h"
#include "afd/common/env_switches.h"
#include "afd/common/error.h"

#ifndef AFD_WITH_CUDA
#define AFD_WITH_CUDA 0
#endif
#if AFD_WITH_NCCL
#include "afd/comm_nccl/nccl_communicator.h"
#endif

namespace {

// vLLM flags a recipe may carry that afd has no counterpart for, and what to do instead.
const std::map<std::string, std::string>& VllmOnlyFlags() {
  static const std::map<std::string, std::string> flags = {
      {"--data-parallel-backend", "afd starts its DP ranks as processes itself"},
      {"--trust-remote-code",
       "afd runs its own model code (DeepSeek-V2/V3, Qwen3-MoE), never a checkpoint's"},
      {"--distributed-executor-backend", "afd starts its ranks as processes itself"},
      {"--pipeline-parallel-size", "pipeline parallelism is not implemented"},
      {"--speculative-config", "speculative decoding is not implemented"},
      {"--enable-prefix-caching", "prefix caching is not implemented"},
      {"--compilation-config", "afd has no torch.compile; CUDA graphs are --cuda-graph-sizes"},
  };
  return flags;
}

// The first argument of `argv` (from 2 on) that `sub` does not take, as afd's error for
// CLI11's ExtrasError (which lists them in reverse with no hint); "" when none is found.
std::string ExplainExtras(const CLI::App& app, int argc, char** argv) {
  if (argc < 2) return "";
  const CLI::App* sub = nullptr;
  try {
    sub = app.get_subcommand(argv[1]);
  } catch (const CLI::OptionNotFound&) {
    return "";
  }
  const std::string cmd = std::string("afd ") + argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") continue;
    if (std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.') continue;  // -1
    const std::string name = arg.substr(0, arg.find('='));
    if (sub->get_option_no_throw(name) != nullptr) continue;
    const auto& vllm = VllmOnlyFlags();
    const auto it = vllm.find(name);
    if (it != vllm.end()) {
      return cmd + ": " + name + " is not supported by afd (a vLLM flag: " + it->second + ")";
    }
    return cmd + ": " + name + " is not supported by afd (`" + cmd +
           " --help` lists the flags it takes)";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"afd: Attention-FFN disaggregated inference runtime for Mixture-of-Experts LLMs"};
  std::string version =
      std::string("afd ") + AFD_VERSION + (AFD_WITH_CUDA ? " (CPU + CUDA" : " (CPU only");
#if AFD_WITH_NCCL
  version += ", " + afd::comm_nccl::DescribeNcclVersions();
#endif
  app.set_version_flag("--version", version + ")");
  app.add_flag_callback(
      "--help-env",
      [] {
        std::cout << afd::EnvSwitchesHelp();
        throw CLI::Success();
      },
      "Print afd's environment variables (what each takes, its default, its meaning) and exit");
  app.require_subcommand(1);
  int exit_code = 0;
  afd::cli::AddTopologyCommand(app, exit_code);
  afd::cli::AddConfigCommand(app, exit_code);
  afd::cli::AddConnectorTestCommand(app, exit_code);
  afd::cli::AddWorkerCommands(app, exit_code);
  afd::cli::AddRunCommand(app, exit_code);
  afd::cli::AddBenchCommand(app, exit_code);
  afd::cli::AddTokenizeCommand(app, exit_code);
  afd::cli::AddK8sCommand(app, exit_code);
  afd::cli::AddProxyCommand(app, exit_code);
  afd::cli::AddQuantizeCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    const std::string why = ExplainExtras(app, argc, argv);
    if (why.empty()) {
      app.exit(e);
    } else {
      std::cerr << why << "\n";
    }
    return 2;
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const afd::Error& e) {
    std::cerr << "afd: error: " << e.what() << "\n";
    if (afd::EnvValue("AFD_DEBUG")) std::cerr << "  (raised at " << e.where() << ")\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "afd: error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}

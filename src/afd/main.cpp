// The `afd` binary: parses the command line and dispatches to a subcommand in cli/.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "afd/cli/commands.h"
#include "afd/common/error.h"

#ifndef AFD_WITH_CUDA
#define AFD_WITH_CUDA 0
#endif
#if AFD_WITH_NCCL
#include "afd/comm_nccl/nccl_communicator.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"afd: Attention-FFN disaggregated inference runtime for Mixture-of-Experts LLMs"};
  std::string version =
      std::string("afd ") + AFD_VERSION + (AFD_WITH_CUDA ? " (CPU + CUDA" : " (CPU only");
#if AFD_WITH_NCCL
  version += ", " + afd::comm::DescribeNcclVersions();
#endif
  app.set_version_flag("--version", version + ")");
  app.require_subcommand(1);
  int exit_code = 0;
  afd::cli::AddTopologyCommand(app, exit_code);
  afd::cli::AddConfigCommand(app, exit_code);
  afd::cli::AddConnectorTestCommand(app, exit_code);
  afd::cli::AddWorkerCommands(app, exit_code);
  afd::cli::AddRunCommand(app, exit_code);
  afd::cli::AddBenchCommand(app, exit_code);
  afd::cli::AddTokenizeCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const afd::Error& e) {
    std::cerr << "afd: error: " << e.what() << "\n";
    if (std::getenv("AFD_DEBUG")) std::cerr << "  (raised at " << e.where() << ")\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "afd: error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}

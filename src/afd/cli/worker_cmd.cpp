// `afd worker`: one rank of an AFD deployment. `afd serve`: the ranks of one role on this host,
// with the flags of the seed recipes (`vllm serve` scripts port by renaming the binary):
//   afd serve --model M --device cpu --data-parallel-size 2 --tensor-parallel-size 1
//     [--data-parallel-size-local 1 --data-parallel-start-rank 1]
//     --additional-config '{"afd": {"role": "attention", ...}}'
// serve starts one `afd worker` per local rank (DP ranks start..start+local-1, each with its TP
// ranks) and fails, naming the rank, when any of them fails. The attention role generates for
// --prompts-file (JSON array of token-id arrays); the HTTP API will take their place.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "afd/cli/commands.h"
#include "afd/cli/generation_flags.h"
#include "afd/common/error.h"
#include "afd/deploy/launcher.h"
#include "afd/deploy/role_worker.h"
#include "afd/deploy/serve.h"
#include "afd/deploy/transport.h"

namespace afd::cli {

namespace {

struct RoleArgs {
  GenerationFlags gen;  // --model and the generation flags, shared with `afd run`
  std::string device = "cpu";
  std::string additional_config;
  int dp = 1, tp = 1;
  int dp_local = -1, dp_start = 0;  // serve only
  bool expert_parallel = false;     // accepted for recipe compatibility: FFN ranks always use EP
  int role_rank = -1;               // worker only
  std::string prompts_file, output_file, stats_file, log_dir;
  bool enforce_eager = false;  // accepted: the CPU path has no graphs to capture
  std::string http_host;       // accepted from recipes; the HTTP API is not built yet
  int http_port = 0;
};

void AddRoleFlags(CLI::App* cmd, RoleArgs& a) {
  AddGenerationFlags(cmd, a.gen);
  cmd->add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--additional-config", a.additional_config,
                  "JSON with the \"afd\" object (role, host, port, rank counts, connector)")
      ->required();
  cmd->add_option("--data-parallel-size", a.dp, "DP size of this role's server")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tensor-parallel-size", a.tp, "TP size of this role's server")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--enable-expert-parallel", a.expert_parallel,
                "Accepted for recipe compatibility (the FFN role always shards experts)");
  cmd->add_option("--prompts-file", a.prompts_file, "Attention: JSON array of token-id arrays");
  cmd->add_flag("--enforce-eager", a.enforce_eager,
                "Accepted for recipe compatibility (the CPU path runs eagerly)");
  cmd->add_option("--host", a.http_host, "HTTP API host (accepted; the API is not built yet)");
  cmd->add_option("--port", a.http_port, "HTTP API port (accepted; the API is not built yet)");
}

std::vector<std::vector<int32_t>> ReadPrompts(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path);
  AFD_CHECK(in.good(), "--prompts-file {}: cannot open the file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    AFD_THROW("--prompts-file {}: not valid JSON: {}", path, e.what());
  }
  AFD_CHECK(j.is_array(), "--prompts-file {}: must be a JSON array of token-id arrays", path);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < j.size(); ++i) {
    AFD_CHECK(j[i].is_array() && !j[i].empty(),
              "--prompts-file {}: prompt {} must be a "
              "non-empty array of token ids",
              path, i);
    std::vector<int32_t> ids;
    for (const auto& v : j[i]) {
      AFD_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                "--prompts-file {}: prompt {} holds {}, not a token id", path, i, v.dump());
      ids.push_back(v.get<int32_t>());
    }
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

deploy::WorkerOptions ToWorkerOptions(const RoleArgs& a) {
  AFD_CHECK(a.device == "cpu",
            "--device {}: this build runs the model on the CPU only; use --device cpu", a.device);
  deploy::WorkerOptions o;
  o.config = ParseAfdConfig(a.additional_config);
  deploy::CheckConnectorImplemented(o.config);
  o.role_rank = a.role_rank;
  o.dp = a.dp;
  o.tp = a.tp;
  o.model = a.gen.model;
  o.open = ToOpenOptions(a.gen);
  o.prompts = ReadPrompts(a.prompts_file);
  ValidateGenerationInput(a.gen, model::PeekModelConfig(a.gen.model), o.prompts);
  o.generation = ToGenerationOptions(a.gen);
  o.dbo = a.gen.dbo;
  o.output_file = a.output_file;
  o.stats_file = a.stats_file;
  return o;
}

// Flags every worker of a role gets from serve (all RoleArgs except the per-rank ones).
std::vector<std::string> PassThrough(const RoleArgs& a) {
  std::vector<std::string> v = GenerationFlagsArgv(a.gen);
  v.insert(v.end(), {"--device", a.device, "--additional-config", a.additional_config,
                     "--data-parallel-size", std::to_string(a.dp), "--tensor-parallel-size",
                     std::to_string(a.tp)});
  if (!a.prompts_file.empty()) v.insert(v.end(), {"--prompts-file", a.prompts_file});
  return v;
}

}  // namespace

void AddWorkerCommands(CLI::App& app, int& exit_code) {
  auto wargs = std::make_shared<RoleArgs>();
  auto* worker = app.add_subcommand("worker", "Run one rank of an AFD deployment");
  AddRoleFlags(worker, *wargs);
  worker
      ->add_option("--role-rank", wargs->role_rank,
                   "This rank within its role: dp_rank * tensor_parallel_size + tp_rank")
      ->required()
      ->check(CLI::NonNegativeNumber);
  worker->add_option("--output-file", wargs->output_file, "Attention: generated results");
  auto exit_with_parent = std::make_shared<int>(0);
  worker->add_option("--exit-with-parent", *exit_with_parent,
                     "PID of the launcher: end this rank when it ends (launchers set it)");
  worker->add_option("--stats-file", wargs->stats_file, "JSON summary of this rank");
  worker->callback([wargs, exit_with_parent, &exit_code] {
    if (*exit_with_parent > 0) deploy::ExitWithParent(*exit_with_parent);
    std::string who = "worker";
    deploy::WorkerOptions o;
    try {
      o = ToWorkerOptions(*wargs);
    } catch (const Error& e) {  // invalid input: exit 2
      std::cerr << "afd worker: " << e.what() << std::endl;
      exit_code = 2;
      return;
    }
    try {
      who = fmt::format("{} rank {}", RoleName(o.config.role), o.role_rank);
      deploy::RunWorker(o);
      exit_code = 0;
    } catch (const Error& e) {
      std::cerr << "afd worker (" << who << "): error: " << e.what() << std::endl;
      exit_code = 1;
    }
  });

  auto sargs = std::make_shared<RoleArgs>();
  auto* serve = app.add_subcommand(
      "serve", "Run this host's ranks of one AFD role (one command per role and host)");
  AddRoleFlags(serve, *sargs);
  serve
      ->add_option("--data-parallel-size-local", sargs->dp_local,
                   "DP ranks on this host (default: all)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--data-parallel-start-rank", sargs->dp_start, "First DP rank on this host")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--output-file", sargs->output_file,
                    "Attention: generated results, one JSON line per prompt of this host");
  serve->add_option("--log-dir", sargs->log_dir, "Where rank logs go (default: a temp dir)");
  serve->callback([sargs, &exit_code] {
    const RoleArgs& a = *sargs;
    deploy::WorkerOptions base;
    try {
      base = ToWorkerOptions(a);  // validates everything before starting
    } catch (const Error& e) {    // invalid input: exit 2
      std::cerr << "afd serve: " << e.what() << std::endl;
      exit_code = 2;
      return;
    }
    try {
      deploy::ServeOptions so;
      so.base = base;
      so.dp_start = a.dp_start;
      so.dp_local = a.dp_local < 0 ? a.dp - a.dp_start : a.dp_local;
      so.log_dir = a.log_dir;
      so.output_file = a.output_file;
      so.worker_flags = PassThrough(a);
      so.http_requested = !a.http_host.empty() || a.http_port != 0;
      deploy::ServeRole(so);
      exit_code = 0;
    } catch (const Error& e) {
      std::cerr << "afd serve: error: " << e.what() << std::endl;
      exit_code = 1;
    }
  });
}

}  // namespace afd::cli

// `afd worker`: one rank of an AFD deployment. `afd serve`: the ranks of one role on this host,
// with the flags of the seed recipes (`vllm serve` scripts port by renaming the binary):
//   afd serve --model M --device cpu --data-parallel-size 2 --tensor-parallel-size 1
//     [--data-parallel-size-local 1 --data-parallel-start-rank 1]
//     --additional-config '{"afd": {"role": "attention", ...}}'
// serve starts one `afd worker` per local rank (DP ranks start..start+local-1, each with its TP
// ranks) and fails, naming the rank, when any of them fails. The attention role generates for
// --prompts-file (JSON array of token-id arrays); the HTTP API will take their place.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "afd/cli/commands.h"
#include "afd/cli/generation_flags.h"
#include "afd/cli/validators.h"
#include "afd/comm/join_secret.h"
#include "afd/common/error.h"
#include "afd/common/stop_signals.h"
#include "afd/common/temp_dir.h"
#include "afd/config/kv_transfer_config.h"
#include "afd/deploy/deployment_run.h"
#include "afd/deploy/dp_ep_worker.h"
#include "afd/deploy/kv_sizing.h"
#include "afd/deploy/launcher.h"
#include "afd/deploy/role_worker.h"
#include "afd/deploy/serve.h"
#include "afd/deploy/transport.h"
#include "afd/kernels/backend.h"
#include "afd/pd/kv_transport.h"
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/server/local_engine_client.h"
#include "afd/server/serve_runner.h"

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
  std::string kernel_trace_csv;  // worker only: a path prefix (role_worker.h)
  bool enforce_eager = false;    // accepted: the CPU path has no graphs to capture
  std::string engine_endpoint;   // worker: serve requests of the frontend there
  std::string dtype;             // serve, in-process model on cuda
  int cuda_device = 0;
  std::string topology;                   // launch
  std::vector<int> cuda_devices;          // launch: of each world rank; serve: of each local rank
  std::vector<int64_t> cuda_graph_sizes;  // serve, in-process model on cuda
  // serve: the OpenAI API (attention role without --prompts-file, or no AFD role at all)
  std::string http_host = "0.0.0.0";
  int http_port = 8000;
  std::string api_key, tokenizer;
  std::string kv_transfer_config;  // serve: prefill/decode disaggregation (docs/pd.md)
  std::vector<std::string> served_model_names;
  int32_t max_logprobs = 20;
  int64_t max_waiting_requests = 0;
  double shutdown_timeout_s = 30;
  int64_t max_request_body_bytes = 8 * 1024 * 1024;
  int64_t max_connections = 16384;
  bool headless = false;         // serve: this host's DP ranks only, no API server
  std::string dp_address;        // serve: the API server's engine listener (vLLM's name)
  int dp_rpc_port = 0;           // serve: its port
  std::string ready_file;        // serve, AFD role without an API: readiness signal
  std::string model_positional;  // serve: `afd serve MODEL`, as `vllm serve MODEL`
  std::set<std::string> given;   // the flags given on the command line ("--max-tokens", ...)
  bool Given(const char* flag) const { return given.count(flag) > 0; }
};

// Records which of `cmd`'s flags the command line gave (RoleArgs::given).
void RecordGivenFlags(const CLI::App* cmd, RoleArgs& a) {
  for (const CLI::Option* o : cmd->get_options()) {
    if (o->count() > 0) a.given.insert(o->get_name());
  }
}

// The first of `flags` that was given, or nullptr.
const char* FirstGiven(const RoleArgs& a, std::initializer_list<const char*> flags) {
  for (const char* f : flags) {
    if (a.Given(f)) return f;
  }
  return nullptr;
}

// The flags of the OpenAI API, which only a command that answers it may take.
constexpr std::initializer_list<const char*> kApiOnlyFlags = {
    "--api-key",        "--served-model-name",    "--kv-transfer-config",
    "--max-logprobs",   "--max-waiting-requests", "--max-request-body-bytes",
    "--max-connections"};
// Flags of one `afd run`-style batch that a server takes from each request instead.
constexpr std::initializer_list<const char*> kBatchOnlyFlags = {"--prompt-logprobs"};

// `afd serve MODEL` (vLLM's form) or `--model MODEL`, not both differing, one of them required.
void ResolveModel(RoleArgs& a) {
  if (!a.model_positional.empty()) {
    AFD_CHECK(a.gen.model.empty() || a.gen.model == a.model_positional,
              "the model is given twice: {} (first argument) and --model {}", a.model_positional,
              a.gen.model);
    a.gen.model = a.model_positional;
  }
  AFD_CHECK(!a.gen.model.empty(),
            "--model is required (a checkpoint directory or preset:NAME; `afd serve MODEL` also "
            "works, as `vllm serve MODEL`)");
}

// As vLLM: without --tokenizer, a checkpoint directory that holds a tokenizer.json is its own.
void DefaultTokenizer(RoleArgs& a) {
  if (a.tokenizer.empty() && a.gen.model.rfind("preset:", 0) != 0 &&
      std::filesystem::is_regular_file(std::filesystem::path(a.gen.model) / "tokenizer.json")) {
    a.tokenizer = a.gen.model;
  }
}

// A rank process (`afd worker`, `afd dp-ep-worker`) ends at once on SIGINT / SIGTERM, exit 0:
// it holds nothing a drain would save (its launcher drains the requests first, and its peers
// name it when it leaves). A thread waits for the signals, blocked in every other thread; call
// before any thread starts.
void ExitOnStopSignal(const std::string& who) {
  BlockStopSignals();
  std::thread([who] {
    while (true) {
      if (const int sig = WaitStopSignal(3600)) {
        std::fprintf(stderr, "afd %s: %s: stopping\n", who.c_str(), StopSignalName(sig));
        std::fflush(stderr);
        std::_Exit(0);
      }
    }
  }).detach();
}

// --dtype and --cuda-device: where and how a model runs on a GPU.
void AddCudaFlags(CLI::App* cmd, RoleArgs& a) {
  cmd->add_option("--dtype", a.dtype, "On cuda: bf16 (default) or fp32 weights")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->add_option("--cuda-device", a.cuda_device, "On cuda: the GPU (default 0)")
      ->check(CLI::NonNegativeNumber);
}

void AddRoleFlags(CLI::App* cmd, RoleArgs& a, bool model_required = true) {
  AddGenerationFlags(cmd, a.gen, model_required);
  cmd->add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  AddCudaFlags(cmd, a);
  cmd->add_option("--additional-config", a.additional_config,
                  "JSON with the \"afd\" object (role, host, port, rank counts, connector)");
  cmd->add_option("--data-parallel-size", a.dp, "DP size of this role's server")->check(Positive());
  cmd->add_option("--tensor-parallel-size", a.tp, "TP size of this role's server")
      ->check(Positive());
  cmd->add_flag("--enable-expert-parallel", a.expert_parallel,
                "AFD: accepted for recipe compatibility (the FFN role always shards experts); "
                "launch without --topology: --data-parallel-size replicas, each attention plus "
                "a share of the routed experts, the MoE expert-parallel over them (no AFD)");
  cmd->add_option("--prompts-file", a.prompts_file, "Attention: JSON array of token-id arrays");
  cmd->add_flag("--enforce-eager", a.enforce_eager,
                "No CUDA graphs (an in-process model, or the AFD roles of the async connector, on "
                "cuda); the CPU always runs eagerly");
  cmd->add_option("--cuda-graph-sizes", a.cuda_graph_sizes,
                  "On cuda: the decode batch buckets captured as CUDA graphs (an in-process "
                  "model, or the AFD attention role of the async connector)")
      ->delimiter(',');
}

// The CUDA graph flags a rank process is given (none: its defaults).
std::vector<std::string> GraphFlagsArgv(bool enforce_eager, const std::vector<int64_t>& sizes) {
  std::vector<std::string> v;
  if (enforce_eager) v.push_back("--enforce-eager");
  if (!sizes.empty()) {
    std::string joined;
    for (int64_t b : sizes) joined += (joined.empty() ? "" : ",") + std::to_string(b);
    v.insert(v.end(), {"--cuda-graph-sizes", joined});
  }
  return v;
}

// The OpenAI API flags of `afd serve` and `afd launch` (vLLM's names).
void AddHttpFlags(CLI::App* cmd, RoleArgs& a) {
  cmd->add_option("--host", a.http_host, "Address the OpenAI API listens on (default 0.0.0.0)");
  cmd->add_option("--port", a.http_port, "Port of the OpenAI API (default 8000)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a.api_key, "Require \"Authorization: Bearer KEY\" on /v1/*");
  cmd->add_option("--tokenizer", a.tokenizer,
                  "Directory with tokenizer.json (and tokenizer_config.json): text prompts and "
                  "chat; a preset model takes its vocabulary size and EOS from it (default: the "
                  "model's directory when it holds a tokenizer.json)");
  cmd->add_option("--served-model-name", a.served_model_names,
                  "Model name(s) the API answers to (default: --model)");
  cmd->add_option("--max-logprobs", a.max_logprobs, "Largest logprobs / top_logprobs (default 20)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-waiting-requests", a.max_waiting_requests,
                  "Waiting sequences before new requests get 503 (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-request-body-bytes", a.max_request_body_bytes,
                  "Largest request body; a larger one gets 413 before it is read (default 8 "
                  "MiB)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 40));
  cmd->add_option("--kv-transfer-config", a.kv_transfer_config,
                  "Prefill/decode disaggregation, vLLM's flag: {\"kv_connector\": "
                  "\"AfdKvConnector\", \"kv_role\": \"kv_producer\" | \"kv_consumer\" | "
                  "\"kv_both\", \"kv_ip\": ..., \"kv_port\": ...} (docs/pd.md; a model served "
                  "in this process, or the attention role's API server of a deployment)");
  cmd->add_option("--max-connections", a.max_connections,
                  "Open HTTP connections at most; past it a connection gets 503 (default 16384)")
      ->check(Positive());
  cmd->add_option("--shutdown-timeout", a.shutdown_timeout_s,
                  "Seconds in-flight requests get to finish after SIGTERM (default 30)")
      ->check(CLI::NonNegativeNumber);
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
  AFD_CHECK(!a.additional_config.empty(), "--additional-config is required: it names the role");
  deploy::WorkerOptions o;
  o.config = ParseAfdConfig(a.additional_config);
  const bool cuda = a.device == "cuda";
  deploy::CheckConnectorImplemented(o.config, cuda);
  o.cuda_device = cuda ? a.cuda_device : -1;
  o.role_rank = a.role_rank;
  o.dp = a.dp;
  o.tp = a.tp;
  o.model = a.gen.model;
  o.open = ToOpenOptions(a.gen);
  ApplyDtype(a.dtype, cuda, o.open);
  o.prompts = ReadPrompts(a.prompts_file);
  ValidateGenerationInput(a.gen, model::PeekModelConfig(a.gen.model, o.open), o.prompts);
  o.generation = ToGenerationOptions(a.gen);
  o.engine_endpoint = a.engine_endpoint;
  if (!a.engine_endpoint.empty()) {
    AFD_CHECK(o.config.role == Role::kAttention, "--engine-endpoint: only attention ranks serve");
    o.engine = ToEngineOptions(a.gen);
    o.kv = ToKvSizing(a.gen);
  }
  o.dbo = a.gen.dbo;
  o.graphs = {a.cuda_graph_sizes, a.enforce_eager};
  DeriveConnectorOptions(o.dbo.enabled, o.config.role == Role::kAttention ? o.tp : 0, o.config);
  o.output_file = a.output_file;
  o.stats_file = a.stats_file;
  o.kernel_trace_csv = a.kernel_trace_csv;
  return o;
}

// Flags every worker of a role gets from serve (all RoleArgs except the per-rank ones).
std::vector<std::string> PassThrough(const RoleArgs& a) {
  std::vector<std::string> v = GenerationFlagsArgv(a.gen);
  v.insert(v.end(), {"--device", a.device, "--additional-config", a.additional_config,
                     "--data-parallel-size", std::to_string(a.dp), "--tensor-parallel-size",
                     std::to_string(a.tp)});
  // --cuda-devices places each rank itself (deploy::ServeOptions::cuda_devices).
  if (a.cuda_devices.empty()) v.insert(v.end(), {"--cuda-device", std::to_string(a.cuda_device)});
  if (!a.dtype.empty()) v.insert(v.end(), {"--dtype", a.dtype});
  if (!a.prompts_file.empty()) v.insert(v.end(), {"--prompts-file", a.prompts_file});
  const std::vector<std::string> g = GraphFlagsArgv(a.enforce_eager, a.cuda_graph_sizes);
  v.insert(v.end(), g.begin(), g.end());
  return v;
}

// The OpenAI API options of serve/launch.
server::ServeHttpOptions ToHttpOptions(const RoleArgs& a) {
  server::ServeHttpOptions o;
  o.api.host = a.http_host;
  o.api.port = a.http_port;
  o.api.api_key = a.api_key;
  o.api.served_model_names =
      a.served_model_names.empty() ? std::vector<std::string>{a.gen.model} : a.served_model_names;
  o.api.max_logprobs = a.max_logprobs;
  o.api.max_waiting_requests = a.max_waiting_requests;
  o.api.max_request_body_bytes = a.max_request_body_bytes;
  o.api.max_connections = a.max_connections;
  // The generation flags given are the defaults of requests that leave those fields out.
  if (const char* f = FirstGiven(a, kBatchOnlyFlags)) {
    AFD_THROW("{} belongs to `afd run`: a server's requests ask for it themselves", f);
  }
  try {
    runtime::ValidateSamplingParams(a.gen.sampling);
  } catch (const Error& e) {
    AFD_THROW("--temperature / --top-k / --top-p (the defaults of requests): {}", e.what());
  }
  if (a.Given("--max-tokens")) {
    AFD_CHECK(a.gen.max_tokens >= 1, "--max-tokens {}: a server's default must be at least 1",
              a.gen.max_tokens);
    o.api.defaults.max_tokens = a.gen.max_tokens;
  }
  if (a.Given("--temperature")) o.api.defaults.temperature = a.gen.sampling.temperature;
  if (a.Given("--top-p")) o.api.defaults.top_p = a.gen.sampling.top_p;
  if (a.Given("--top-k")) o.api.defaults.top_k = a.gen.sampling.top_k;
  if (a.Given("--seed")) o.api.defaults.seed = a.gen.sampling.seed;
  o.api.defaults.ignore_eos = a.gen.ignore_eos;
  if (!a.kv_transfer_config.empty()) {
    o.api.kv_transfer = ParseKvTransferConfig(a.kv_transfer_config);
    for (const std::string& ignored : o.api.kv_transfer->ignored) {
      std::fprintf(stderr, "afd: warning: --kv-transfer-config %s is ignored by AfdKvConnector\n",
                   ignored.c_str());
    }
    AFD_CHECK(
        o.api.kv_transfer->transport != KvTransferConfig::Transport::kCudaIpc || a.device == "cuda",
        "--kv-transfer-config: kv_connector_extra_config.transport cuda_ipc needs engines "
        "on a GPU (--device cuda), this server's run on {}",
        a.device);
    o.api.kv_secret = comm::ResolveJoinSecret(o.api.kv_transfer->kv_ip);
  }
  o.tokenizer_dir = a.tokenizer;
  o.shutdown_timeout_s = a.shutdown_timeout_s;
  o.api.Validate();
  return o;
}

// A preset model served with a tokenizer takes its vocabulary size and EOS id from it.
void SizePresetToTokenizer(GenerationFlags& gen, const server::ServingTokenizer& tok) {
  if (!tok.tokenizer || gen.model.rfind("preset:", 0) != 0) return;
  if (gen.preset_vocab_size == 0) gen.preset_vocab_size = tok.tokenizer->IdEnd();
  if (gen.preset_eos_token_ids.empty() && !tok.tokenizer->eos_token().empty()) {
    if (const auto id = tok.tokenizer->TokenToId(tok.tokenizer->eos_token())) {
      gen.preset_eos_token_ids = {static_cast<int64_t>(*id)};
    }
  }
}

// Flags a model served in this process cannot honour: an error naming the flag and what does.
void CheckInProcessFlags(const RoleArgs& a) {
  if (const char* f = FirstGiven(
          a, {"--enable-dbo", "--dbo-decode-token-threshold", "--dbo-prefill-token-threshold"})) {
    AFD_THROW(
        "{}: dual-batch overlap pipelines AFD's attention and FFN roles; a model served in one "
        "process has no roles (give --additional-config with a role, or use afd launch "
        "--topology xAyF)",
        f);
  }
  if (const char* f =
          FirstGiven(a, {"--data-parallel-start-rank", "--data-parallel-size-local", "--headless",
                         "--data-parallel-address", "--data-parallel-rpc-port", "--ready-file"})) {
    AFD_THROW("{} places the DP ranks of an AFD role on hosts: give --additional-config", f);
  }
  AFD_CHECK(a.tp == 1,
            "--tensor-parallel-size {}: a model served in one process runs on one device; "
            "tensor parallelism is the attention role's (afd launch --topology xAyF "
            "--attention-tp {}, or --additional-config)",
            a.tp, a.tp);
  AFD_CHECK(a.dp == 1 || a.expert_parallel,
            "--data-parallel-size {} without --enable-expert-parallel: data-parallel replicas "
            "serve with the MoE expert-parallel over them (add --enable-expert-parallel) or as "
            "AFD attention ranks (--additional-config)",
            a.dp);
  AFD_CHECK(a.dp > 1 || a.cuda_devices.empty(),
            "--cuda-devices places several ranks; a model served in one process uses "
            "--cuda-device");
}

// `afd serve` of a model in this process.
int ServeInProcess(RoleArgs& a) {
  server::ServingTokenizer tok;
  server::ServeHttpOptions http;
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::MoeModel> model;
  runtime::EngineOptions engine;
  try {
    tok = server::LoadServingTokenizer(a.tokenizer);
    SizePresetToTokenizer(a.gen, tok);
    ApplyServingDefaults(a.gen);
    http = ToHttpOptions(a);
    engine = ToEngineOptions(a.gen);
    model::OpenOptions open = ToOpenOptions(a.gen);
    // Before the weights load (minutes for a large model), as `afd launch` checks it.
    CheckMaxModelLen(a.gen, model::PeekModelConfig(a.gen.model, open));
    const bool cuda = a.device == "cuda";
    ApplyDtype(a.dtype, cuda, open);
    model::LoadedModel loaded = model::LoadModel(a.gen.model, open, cuda ? a.cuda_device : -1);
    backend = std::move(loaded.backend);
    model = std::move(loaded.model);
    if (engine.num_kv_blocks == 0) {
      engine.num_kv_blocks = deploy::ServingKvBlocks(*model, ToKvSizing(a.gen));
    }
  } catch (const Error& e) {
    std::cerr << "afd serve: " << e.what() << std::endl;
    return 2;
  }
  std::cerr << "afd serve: " << model->config().num_hidden_layers << "-layer model on "
            << backend->name() << "; " << deploy::DescribeKvBlocks(*model, engine.num_kv_blocks)
            << std::endl;
  // On cuda, decode steps replay CUDA graphs (unless --enforce-eager); on cpu all is eager.
  runtime::CudaGraphRunner runner(*model, {a.cuda_graph_sizes, a.enforce_eager});
  server::LocalEngineClient client(*model, runner, engine);
  try {
    return server::ServeEngine(http, client, tok);
  } catch (const Error& e) {
    std::cerr << "afd serve: error: " << e.what() << std::endl;
    return 1;
  }
}

int LaunchCommand(RoleArgs& a);

int ServeCommand(RoleArgs& a) {
  BlockStopSignals();  // before any thread starts: the serve loop waits for them
  try {
    ResolveModel(a);
    DefaultTokenizer(a);
    if (a.additional_config.empty()) {
      AFD_CHECK(a.prompts_file.empty() && a.output_file.empty(),
                "--prompts-file and --output-file belong to an AFD role: give "
                "--additional-config");
      CheckInProcessFlags(a);
    }
  } catch (const Error& e) {
    std::cerr << "afd serve: " << e.what() << std::endl;
    return 2;
  }
  if (a.additional_config.empty()) {
    // `--data-parallel-size N --enable-expert-parallel`, as vLLM: N replicas, each attention
    // plus a share of the routed experts, the MoE expert-parallel over them (afd launch's).
    if (a.dp > 1) return LaunchCommand(a);
    return ServeInProcess(a);
  }
  deploy::WorkerOptions base;
  server::ServingTokenizer tok;
  server::ServeHttpOptions http;
  server::EngineListenOptions listen;
  bool api = false, headless = false, remote_replicas = false;
  try {
    const AfdConfig role = ParseAfdConfig(a.additional_config);
    // --headless on an FFN role is what it is anyway: it never answers the API.
    headless = a.headless && role.role == Role::kAttention;
    api = role.role == Role::kAttention && a.prompts_file.empty() && !headless;
    if (!api) {
      if (const char* f = FirstGiven(a, kApiOnlyFlags)) {
        AFD_THROW("{} configures the OpenAI API, which {}", f,
                  role.role == Role::kFfn
                      ? "the FFN role does not answer (give it to the attention role's command)"
                  : headless ? "a headless host does not answer (give it to the API server's)"
                             : "an attention role with --prompts-file does not answer");
      }
    }
    if (role.role == Role::kFfn) {
      AFD_CHECK(a.prompts_file.empty() && a.output_file.empty(),
                "--prompts-file and --output-file belong to the attention role");
      if (const char* f = FirstGiven(a, {"--data-parallel-address", "--data-parallel-rpc-port"})) {
        AFD_THROW(
            "{} belongs to the attention role (its API server's engine listener); FFN ranks "
            "find each other through the \"host\" / \"port\" of --additional-config",
            f);
      }
    }
    const int dp_local = a.dp_local < 0 ? a.dp - a.dp_start : a.dp_local;
    if (role.role == Role::kAttention && !api && !headless) {
      if (const char* f = FirstGiven(a, {"--data-parallel-address", "--data-parallel-rpc-port"})) {
        AFD_THROW(
            "{}: an attention role with --prompts-file has no engine listener (it is for "
            "the API server's command and headless hosts)",
            f);
      }
    }
    if (headless) {
      AFD_CHECK(a.prompts_file.empty(),
                "--headless serves an API server's requests: leave out "
                "--prompts-file");
      AFD_CHECK(!a.dp_address.empty() && a.dp_rpc_port > 0,
                "--headless needs --data-parallel-address and --data-parallel-rpc-port: where "
                "the API server's host listens for this host's replicas");
      AFD_CHECK(dp_local >= 1, "--headless with --data-parallel-size-local 0 runs nothing");
    }
    // An API server expecting replicas of other hosts listens where they can reach it.
    remote_replicas = api && (dp_local < a.dp || !a.dp_address.empty() || a.dp_rpc_port > 0);
    if (remote_replicas) {
      AFD_CHECK(!a.dp_address.empty() && a.dp_rpc_port > 0,
                "this host runs {} of the {} DP ranks (--data-parallel-size-local): the others "
                "connect to its API server, which needs --data-parallel-address (the address "
                "to listen on, 0.0.0.0 for every interface) and --data-parallel-rpc-port",
                dp_local, a.dp);
    }
    AFD_CHECK(!api || a.ready_file.empty(),
              "--ready-file is the readiness signal of a command without an API; this one "
              "answers GET /health");
    if (headless || remote_replicas) {
      try {
        listen.secret = comm::ResolveJoinSecret(a.dp_address);
      } catch (const Error& e) {
        AFD_THROW("--data-parallel-address {}: {}", a.dp_address, e.what());
      }
      listen.host = a.dp_address;
      listen.port = a.dp_rpc_port;
    }
    if (headless) ApplyServingDefaults(a.gen);  // the API server's engine flags
    if (api) {
      tok = server::LoadServingTokenizer(a.tokenizer);
      SizePresetToTokenizer(a.gen, tok);
      ApplyServingDefaults(a.gen);
      http = ToHttpOptions(a);
      ToEngineOptions(a.gen);  // checks the engine flags now
    } else if (role.role == Role::kFfn && !a.tokenizer.empty()) {
      // The FFN ranks must build the same preset as the attention ranks.
      tok = server::LoadServingTokenizer(a.tokenizer);
      SizePresetToTokenizer(a.gen, tok);
    }
    AFD_CHECK(a.cuda_devices.empty() || a.device == "cuda",
              "--cuda-devices places the ranks on GPUs: it needs --device cuda");
    base = ToWorkerOptions(a);  // validates everything before starting
  } catch (const Error& e) {    // invalid input: exit 2
    std::cerr << "afd serve: " << e.what() << std::endl;
    return 2;
  }
  try {
    deploy::ServeOptions so;
    so.base = base;
    so.dp_start = a.dp_start;
    so.dp_local = a.dp_local < 0 ? a.dp - a.dp_start : a.dp_local;
    so.log_dir = a.log_dir;
    so.output_file = a.output_file;
    so.worker_flags = PassThrough(a);
    so.cuda_devices = a.cuda_devices;
    so.ready_file = a.ready_file;
    if (headless) {
      // This host's replicas serve the API server at --data-parallel-address:port.
      so.engine_endpoint = fmt::format("{}:{}", a.dp_address, a.dp_rpc_port);
      std::cerr << "afd serve: headless: " << so.dp_local << " attention replica(s) serving the "
                << "API server at " << so.engine_endpoint << std::endl;
    }
    if (!api) {
      deploy::ServeRole(so);
      return 0;
    }
    std::string dir;
    std::vector<deploy::RankProcessSpec> specs;
    if (so.dp_local > 0) specs = deploy::ServeRankSpecs(so, &dir);
    // No EnsureLocalJoinSecret here: these ranks join the store of FFN rank 0, which another
    // command started; they take the secret (or none, on loopback) from the environment as it
    // does, so the seed's two commands pair up with no secret and with the same one exported.
    if (remote_replicas) {
      std::cerr << fmt::format(
                       "afd serve: the API server of all {} DP ranks ({} on this host); the "
                       "others' replicas connect to {}:{}",
                       a.dp, so.dp_local, listen.host, listen.port)
                << std::endl;
      return server::ServeReplicas(http, std::move(specs), a.dp, 0, tok, listen);
    }
    return server::ServeReplicas(http, std::move(specs), so.dp_local, so.dp_start, tok);
  } catch (const Error& e) {
    std::cerr << "afd serve: error: " << e.what() << std::endl;
    return 1;
  }
}

int LaunchCommand(RoleArgs& a) {
  BlockStopSignals();
  DefaultTokenizer(a);
  server::ServingTokenizer tok;
  server::ServeHttpOptions http;
  deploy::DeploymentSpec spec;
  std::vector<deploy::RankProcessSpec> specs;
  std::string dir = a.log_dir;
  int num_replicas = 0;
  try {
    tok = server::LoadServingTokenizer(a.tokenizer);
    SizePresetToTokenizer(a.gen, tok);
    ApplyServingDefaults(a.gen);
    http = ToHttpOptions(a);
    ToEngineOptions(a.gen);
    const model::ModelConfig c = model::PeekModelConfig(a.gen.model, ToOpenOptions(a.gen));
    AFD_CHECK(a.tp <= c.num_attention_heads, "--attention-tp {} exceeds the model's {} heads", a.tp,
              c.num_attention_heads);
    CheckMaxModelLen(a.gen, c);
    spec.topology = a.topology;
    AFD_CHECK(!a.topology.empty() || a.expert_parallel,
              "--topology xAyF is required (or --data-parallel-size N --enable-expert-parallel: "
              "data-parallel replicas with the MoE expert-parallel over them, no AFD)");
    // No topology and --enable-expert-parallel: data-parallel replicas with the MoE
    // expert-parallel over them (no AFD), --data-parallel-size of them.
    if (a.topology.empty()) spec.expert_parallel_size = a.dp;
    spec.attention_tp = a.tp;
    spec.additional_config = a.additional_config;
    spec.worker_flags = GenerationFlagsArgv(a.gen);
    const std::vector<std::string> g = GraphFlagsArgv(a.enforce_eager, a.cuda_graph_sizes);
    spec.worker_flags.insert(spec.worker_flags.end(), g.begin(), g.end());
    spec.cuda = a.device == "cuda";
    spec.cuda_devices = a.cuda_devices;
    if (spec.cuda) {
      const std::vector<std::string> f = deploy::CudaWorkerFlags(spec, a.cuda_device, a.dtype);
      spec.worker_flags.insert(spec.worker_flags.end(), f.begin(), f.end());
    }
    spec.show_rank_map = true;
    if (dir.empty()) {
      dir = MakePrivateTempDir("afd-launch-");
    }
    std::filesystem::create_directories(dir);
    specs = deploy::DeploymentRankSpecs(spec, dir, "");
    for (const auto& s : specs) num_replicas += s.serves_engine ? 1 : 0;
    num_replicas /= a.tp;
  } catch (const Error& e) {
    std::cerr << "afd launch: " << e.what() << std::endl;
    return 2;
  }
  std::cerr << "afd launch: " << specs.size() << " processes, logs in " << dir << std::endl;
  comm::EnsureLocalJoinSecret();  // every rank is a child of this process: one fresh secret
  try {
    return server::ServeReplicas(http, std::move(specs), num_replicas, 0, tok);
  } catch (const Error& e) {
    std::cerr << "afd launch: error: " << e.what() << std::endl;
    return 1;
  }
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
  worker->add_option("--kernel-trace-csv", wargs->kernel_trace_csv,
                     "CUDA: every kernel this rank runs, one CSV line each, written to "
                     "PREFIX{attention|ffn}{rank}.csv (afd bench decode --topology sets it)");
  worker->add_option("--engine-endpoint", wargs->engine_endpoint,
                     "Attention: serve the requests of the frontend at host:port (serve and "
                     "launch set it)");
  worker->callback([wargs, exit_with_parent, &exit_code] {
    if (*exit_with_parent > 0) deploy::ExitWithParent(*exit_with_parent);
    ExitOnStopSignal("worker");
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

  // One rank of `afd run --data-parallel-size N --enable-expert-parallel` (a launcher starts it).
  auto eargs = std::make_shared<RoleArgs>();
  auto ep = std::make_shared<deploy::DpEpWorkerOptions>();
  auto* dp_ep =
      app.add_subcommand("dp-ep-worker",
                         "Run one rank of a data-parallel + expert-parallel deployment (afd run "
                         "--data-parallel-size N --enable-expert-parallel starts them)");
  AddGenerationFlags(dp_ep, eargs->gen);
  dp_ep->add_option("--device", eargs->device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  AddCudaFlags(dp_ep, *eargs);
  dp_ep->add_option("--data-parallel-rank", ep->rank, "This rank")
      ->required()
      ->check(CLI::NonNegativeNumber);
  dp_ep->add_option("--data-parallel-size", ep->size, "Ranks of the deployment")
      ->required()
      ->check(Positive());
  dp_ep->add_option("--rendezvous-port", ep->port, "Port of the store on 127.0.0.1 (rank 0's)")
      ->required()
      ->check(CLI::Range(1, 65535));
  dp_ep->add_option("--prompts-file", eargs->prompts_file, "JSON array of token-id arrays");
  dp_ep->add_option("--output-file", ep->output_file, "Generated results of this rank's prompts");
  dp_ep->add_option("--stats-file", ep->stats_file, "JSON summary of this rank");
  dp_ep->add_option("--engine-endpoint", ep->engine_endpoint,
                    "Serve the requests of the frontend at host:port (afd launch sets it)");
  auto dp_ep_parent = std::make_shared<int>(0);
  dp_ep->add_option("--exit-with-parent", *dp_ep_parent,
                    "PID of the launcher: end this rank when it ends (launchers set it)");
  dp_ep->callback([eargs, ep, dp_ep_parent, &exit_code] {
    if (*dp_ep_parent > 0) deploy::ExitWithParent(*dp_ep_parent);
    ExitOnStopSignal("dp-ep-worker");
    deploy::DpEpWorkerOptions o = *ep;
    try {
      AFD_CHECK(o.rank < o.size, "--data-parallel-rank {}: at most --data-parallel-size {} - 1",
                o.rank, o.size);
      AFD_CHECK(!eargs->gen.dbo.enabled,
                "--enable-dbo overlaps AFD's attention and FFN roles; a data-parallel + "
                "expert-parallel rank has no roles to overlap");
      const bool cuda = eargs->device == "cuda";
      o.cuda_device = cuda ? eargs->cuda_device : -1;
      o.model = eargs->gen.model;
      o.open = ToOpenOptions(eargs->gen);
      ApplyDtype(eargs->dtype, cuda, o.open);
      o.prompts = ReadPrompts(eargs->prompts_file);
      ValidateGenerationInput(eargs->gen, model::PeekModelConfig(o.model, o.open), o.prompts);
      o.generation = ToGenerationOptions(eargs->gen);
      if (!o.engine_endpoint.empty()) {
        AFD_CHECK(o.prompts.empty(), "--engine-endpoint serves requests: leave out --prompts-file");
        o.engine = ToEngineOptions(eargs->gen);
        o.kv = ToKvSizing(eargs->gen);
      }
    } catch (const Error& e) {  // invalid input: exit 2
      std::cerr << "afd dp-ep-worker: " << e.what() << std::endl;
      exit_code = 2;
      return;
    }
    try {
      deploy::RunDpEpWorker(o);
      exit_code = 0;
    } catch (const Error& e) {
      std::cerr << "afd dp-ep-worker (data-parallel rank " << o.rank << "): error: " << e.what()
                << std::endl;
      exit_code = 1;
    }
  });

  auto sargs = std::make_shared<RoleArgs>();
  auto* serve = app.add_subcommand(
      "serve",
      "Serve the OpenAI API: a model in this process (no --additional-config), or this host's "
      "ranks of one AFD role (one command per role and host; the attention role answers the "
      "API unless --prompts-file is given)");
  AddRoleFlags(serve, *sargs, /*model_required=*/false);
  AddHttpFlags(serve, *sargs);
  serve
      ->add_option("--data-parallel-size-local", sargs->dp_local,
                   "DP ranks on this host (default: all; 0 with --data-parallel-address: an API "
                   "server whose replicas all run on headless hosts)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--data-parallel-start-rank", sargs->dp_start, "First DP rank on this host")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--ready-file", sargs->ready_file,
                    "FFN role or headless host: write this file once every local rank has joined "
                    "the deployment, remove it when they stop (a readiness signal; the API "
                    "server's is GET /health)");
  serve->add_flag("--headless", sargs->headless,
                  "Attention role: run this host's DP ranks only, serving the API server at "
                  "--data-parallel-address:--data-parallel-rpc-port (vLLM's multi-node DP)");
  serve->add_option("--data-parallel-address", sargs->dp_address,
                    "Attention role: the API server's engine listener -- where it listens "
                    "(0.0.0.0: every interface) and where headless hosts' replicas connect");
  serve
      ->add_option("--data-parallel-rpc-port", sargs->dp_rpc_port,
                   "Attention role: the port of that listener")
      ->check(CLI::Range(1, 65535));
  serve->add_option("--output-file", sargs->output_file,
                    "Attention with --prompts-file: generated results, one JSON line per prompt");
  serve->add_option("--log-dir", sargs->log_dir, "Where rank logs go (default: a temp dir)");
  serve
      ->add_option("--cuda-devices", sargs->cuda_devices,
                   "With --device cuda: the GPU of each of this host's ranks, in rank order (e.g. "
                   "0,1,2,3 for --data-parallel-size-local 4); default: all on --cuda-device")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  serve->add_option("model", sargs->model_positional,
                    "The model, as `vllm serve MODEL` takes it (or --model)");
  serve->callback([sargs, serve, &exit_code] {
    RecordGivenFlags(serve, *sargs);
    exit_code = ServeCommand(*sargs);
  });

  auto largs = std::make_shared<RoleArgs>();
  auto* launch = app.add_subcommand(
      "launch",
      "Start a whole AFD deployment on this host (every attention and FFN rank) and serve the "
      "OpenAI API in front of it until SIGINT/SIGTERM");
  AddGenerationFlags(launch, largs->gen);
  AddHttpFlags(launch, *largs);
  launch->add_option("--topology", largs->topology,
                     "xAyF: attention and FFN rank counts (required, unless "
                     "--enable-expert-parallel)");
  launch
      ->add_option("--data-parallel-size", largs->dp,
                   "With --enable-expert-parallel and no --topology: that many replicas, each "
                   "attention plus a share of the routed experts (default 1)")
      ->check(Positive());
  launch->add_flag("--enable-expert-parallel", largs->expert_parallel,
                   "Without --topology: data-parallel replicas with the MoE expert-parallel over "
                   "them, no AFD (the monolithic baseline; --cuda-devices: one GPU each)");
  launch->add_option("--attention-tp", largs->tp, "Tensor-parallel size of an attention replica")
      ->check(Positive());
  launch->add_option("--additional-config", largs->additional_config,
                     "Extra fields of the \"afd\" object (e.g. compute_gate_on_attention)");
  launch
      ->add_option("--device", largs->device,
                   "cpu or cuda (every rank on --cuda-device, the roles exchanging rows through "
                   "CUDA IPC windows of the async connector; or placed by --cuda-devices)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  AddCudaFlags(launch, *largs);
  launch
      ->add_option("--cuda-devices", largs->cuda_devices,
                   "With --device cuda: the GPU of each world rank, FFN ranks first (one GPU per "
                   "rank for P2pNcclAFDConnector or the NCCL window); default: every rank on "
                   "--cuda-device")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  launch->add_option("--log-dir", largs->log_dir, "Where rank logs go (default: a temp dir)");
  launch->add_flag("--enforce-eager", largs->enforce_eager,
                   "No CUDA graphs in the ranks (the async connector's AFD roles capture decode "
                   "steps on cuda; P2P and DP + EP ranks run eagerly)");
  launch
      ->add_option("--cuda-graph-sizes", largs->cuda_graph_sizes,
                   "On cuda: the attention role's decode batch buckets captured as CUDA graphs")
      ->delimiter(',');
  launch->callback([largs, launch, &exit_code] {
    RecordGivenFlags(launch, *largs);
    exit_code = LaunchCommand(*largs);
  });
}

}  // namespace afd::cli

// `afd run`: loads a model (checkpoint directory or preset:NAME) and generates in this process.
// Several --prompt-ids run together as one batch. Exit 2 for invalid input (arguments, model
// directory or checkpoint content), 1 for failures while running.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afd/cli/commands.h"
#include "afd/cli/generation_flags.h"
#include "afd/cli/validators.h"
#include "afd/common/error.h"
#include "afd/deploy/deployment_run.h"
#include "afd/deploy/result_json.h"
#include "afd/diag/npy.h"
#include "afd/model/loader.h"
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/runtime/generator.h"

namespace afd::cli {

namespace {

struct RunArgs {
  GenerationFlags gen;  // --model and the generation flags, shared with `afd worker`
  std::vector<std::string> prompt_ids;
  bool json = false;
  std::string dump_logits;
  bool stats = false;
  std::string device = "cpu";  // cpu or cuda
  std::string dtype;           // "" (cpu: fp32 unless big or --bf16; cuda: bf16), bf16, fp32
  int cuda_device = 0;
  runtime::CudaGraphOptions graphs;   // --cuda-graph-sizes, --enforce-eager (cuda only)
  deploy::DeploymentSpec deployment;  // --topology: run on an AFD deployment of local processes
  // --data-parallel-size N --enable-expert-parallel: N local ranks, attention data-parallel and
  // the MoE expert-parallel over them (no AFD; deployment.expert_parallel_size = N).
  int data_parallel_size = 0;
  bool enable_expert_parallel = false;
};

// "1,2,3" -> {1, 2, 3}; throws afd::Error on anything else.
std::vector<int32_t> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? comma : comma - pos);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    AFD_CHECK(used == item.size() && !item.empty() && v >= 0 && v <= INT32_MAX,
              "--prompt-ids \"{}\": \"{}\" is not a token id (expected comma-separated "
              "non-negative integers)",
              text, item);
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

// `afd run --topology` (or --data-parallel-size N --enable-expert-parallel): the same prompts and
// output through a deployment of local rank processes.
void RunOnDeployment(const RunArgs& args, const std::vector<std::vector<int32_t>>& prompts,
                     int& exit_code) {
  deploy::DeploymentSpec spec = args.deployment;
  spec.print_stats = args.stats;
  spec.worker_flags = GenerationFlagsArgv(args.gen);
  spec.cuda = args.device == "cuda";
  if (args.graphs.enforce_eager) spec.worker_flags.push_back("--enforce-eager");
  if (!args.graphs.sizes.empty()) {
    std::string joined;
    for (int64_t b : args.graphs.sizes) joined += (joined.empty() ? "" : ",") + std::to_string(b);
    spec.worker_flags.insert(spec.worker_flags.end(), {"--cuda-graph-sizes", joined});
  }
  if (spec.cuda) {
    // Every rank on --cuda-device (CUDA IPC windows between them), or each on its own of
    // --cuda-devices.
    const std::vector<std::string> f = deploy::CudaWorkerFlags(spec, args.cuda_device, args.dtype);
    spec.worker_flags.insert(spec.worker_flags.end(), f.begin(), f.end());
  }
  std::vector<deploy::DeploymentResult> results;
  try {
    results = deploy::RunDeployment(spec, prompts);
  } catch (const Error& e) {
    std::cerr << "afd run (" << deploy::DeploymentName(spec) << "): " << e.what() << "\n";
    exit_code = 1;
    return;
  }
  for (size_t s = 0; s < results.size(); ++s) {
    if (args.json) {
      std::cout << results[s].json_line << "\n";
    } else {
      std::cout << "prompt " << s << " (" << results[s].prompt_ids.size() << " tokens) ->";
      for (int32_t id : results[s].output_ids) std::cout << " " << id;
      std::cout << "\n";
    }
  }
  exit_code = 0;
}

void Run(RunArgs args, int& exit_code) {
  // --json prints the prompt log-probabilities: compute them (here and on every rank).
  args.gen.prompt_logprobs = args.gen.prompt_logprobs || args.json;
  std::vector<std::vector<int32_t>> prompts;
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::MoeModel> model;
  runtime::GenerationOptions options;
  const auto load_start = std::chrono::steady_clock::now();
  try {  // everything that depends on user input: exit 2
    for (const std::string& p : args.prompt_ids) prompts.push_back(ParseIds(p));
    AFD_CHECK(args.dump_logits.empty() || prompts.size() == 1,
              "--dump-logits needs exactly one --prompt-ids, got {}", prompts.size());
    AFD_CHECK(args.gen.max_tokens >= 0, "--max-tokens must be >= 0, got {}", args.gen.max_tokens);
    model::OpenOptions open = ToOpenOptions(args.gen);
    const bool cuda = args.device == "cuda";

    AFD_CHECK(args.dtype.empty() || !args.gen.bf16 || args.dtype == "bf16",
              "--bf16 and --dtype {} disagree", args.dtype);
    ApplyDtype(args.dtype, cuda, open);
    model::LoadedModel loaded =
        model::LoadModel(args.gen.model, open, cuda ? args.cuda_device : -1);
    backend = std::move(loaded.backend);
    model = std::move(loaded.model);
    const model::ModelConfig& c = model->config();
    AFD_CHECK(args.data_parallel_size == 0 || args.enable_expert_parallel,
              "--data-parallel-size {} runs data-parallel ranks with the MoE expert-parallel "
              "over them: add --enable-expert-parallel (plain data parallelism is that many "
              "independent afd run processes)",
              args.data_parallel_size);
    if (args.enable_expert_parallel) {
      args.deployment.expert_parallel_size = std::max(1, args.data_parallel_size);
    }
    if (args.deployment.expert_parallel_size > 0) {
      deploy::DeploymentSpec ep = args.deployment;
      ep.cuda = cuda;
      deploy::CheckDataParallelExpertParallel(ep);
    }
    const bool deployed =
        !args.deployment.topology.empty() || args.deployment.expert_parallel_size > 0;
    AFD_CHECK(args.dump_logits.empty() || !deployed,
              "--dump-logits is not available with rank processes (--topology, "
              "--data-parallel-size)");
    AFD_CHECK(args.deployment.cuda_devices.empty() || deployed,
              "--cuda-devices places the ranks of --topology (or of --data-parallel-size); one "
              "process takes --cuda-device");
    AFD_CHECK(!args.gen.dbo.enabled || !args.deployment.topology.empty(),
              "--enable-dbo overlaps the attention and FFN roles: it needs --topology");
    AFD_CHECK(
        args.deployment.topology.empty() || args.deployment.attention_tp <= c.num_attention_heads,
        "--attention-tp {} exceeds the model's {} attention heads", args.deployment.attention_tp,
        c.num_attention_heads);
    ValidateGenerationInput(args.gen, c, prompts);
  } catch (const Error& e) {
    std::cerr << "afd run: " << e.what() << "\n";
    exit_code = 2;
    return;
  }
  if (!args.deployment.topology.empty() || args.deployment.expert_parallel_size > 0) {
    model.reset();  // the rank processes load their own copies
    RunOnDeployment(args, prompts, exit_code);
    return;
  }
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  options = ToGenerationOptions(args.gen);
  options.keep_prompt_logits = !args.dump_logits.empty();
  // On cuda, decode steps replay CUDA graphs (unless --enforce-eager); on cpu every step is eager.
  runtime::CudaGraphRunner runner(*model, args.graphs);
  runtime::Generator generator(*model, runner);
  runtime::GenerationStats stats;
  const auto results = generator.Generate(prompts, options, &stats);
  if (!args.dump_logits.empty()) {
    const int64_t t = results[0].prompt_ids.size();
    diag::WriteNpyF32(args.dump_logits, results[0].prompt_logits.data(),
                      {t, model->config().vocab_size});
  }
  for (size_t s = 0; s < results.size(); ++s) {
    if (args.json) {
      std::cout << deploy::ResultJsonLine(results[s]) << "\n";
    } else {
      std::cout << "prompt " << s << " (" << results[s].prompt_ids.size() << " tokens) ->";
      for (int32_t id : results[s].output_ids) std::cout << " " << id;
      std::cout << "\n";
    }
  }
  if (args.stats) {
    const model::ModelConfig& c = model->config();
    std::cerr << fmt::format("model: {} layers, {} parameters, weights as {}\n",
                             c.num_hidden_layers, model::ParameterCount(c),
                             DTypeName(model->weights().lm_head.dtype()));
    std::cerr << fmt::format(
        "load: {:.3f} s\nprefill: {} tokens in {:.4f} s = {:.1f} tokens/s\n"
        "decode: {} tokens in {} steps, {:.4f} s = {:.1f} tokens/s ({:.2f} ms/step)\n",
        load_seconds, stats.prefill_tokens, stats.prefill_seconds,
        stats.prefill_tokens / std::max(stats.prefill_seconds, 1e-9), stats.decode_tokens,
        stats.decode_steps, stats.decode_seconds,
        stats.decode_tokens / std::max(stats.decode_seconds, 1e-9),
        1e3 * stats.decode_seconds / std::max<int64_t>(stats.decode_steps, 1));
    std::cerr << fmt::format("kv cache: {} blocks of {} tokens, peak {} in use, {} preemptions\n",
                             stats.kv_blocks, kv::kDefaultBlockSize, stats.peak_kv_blocks,
                             stats.preemptions);
    if (stats.mixed_steps > 0) {
      std::cerr << fmt::format("mixed: {} steps of prefill + decode ({} + {} tokens) in {:.4f} s\n",
                               stats.mixed_steps, stats.mixed_prefill_tokens,
                               stats.mixed_decode_tokens, stats.mixed_seconds);
    }
  }
  exit_code = 0;
}

}  // namespace

void AddRunCommand(CLI::App& app, int& exit_code) {
  auto* run = app.add_subcommand(
      "run", "Run a DeepSeek-V2/V3 model in this process (CPU or one GPU) on token-id prompts");
  auto args = std::make_shared<RunArgs>();
  AddGenerationFlags(run, args->gen);
  run->add_option("--prompt-ids", args->prompt_ids,
                  "Comma-separated token ids of one prompt; repeat for a batch")
      ->required()
      ->take_all()
      ->expected(1)
      ->allow_extra_args(false);
  run->add_flag("--json", args->json, "One JSON object per prompt per line");
  run->add_option("--dump-logits", args->dump_logits,
                  "Write the logits of every prompt position as float32 .npy [prompt_len, vocab] "
                  "(one prompt only)");
  run->add_flag("--stats", args->stats, "Print load/prefill/decode timings to stderr");
  run->add_option("--device", args->device, "cpu (default; the exact reference) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  run->add_option("--dtype", args->dtype,
                  "Weight matrices as bf16 or fp32 (default: bf16 on cuda; fp32 on cpu unless the "
                  "model is big)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  run->add_option("--cuda-device", args->cuda_device, "CUDA device ordinal (default 0)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--cuda-graph-sizes", args->graphs.sizes,
                  "Decode batch buckets captured as CUDA graphs, comma-separated")
      ->delimiter(',')
      ->check(Positive());
  run->add_flag("--enforce-eager", args->graphs.enforce_eager, "No CUDA graphs");
  run->add_option("--topology", args->deployment.topology,
                  "Run on an AFD deployment xAyF of processes on this host (e.g. 3A2F)");
  run->add_option("--data-parallel-size", args->data_parallel_size,
                  "With --enable-expert-parallel: that many rank processes on this host, each "
                  "attention for its share of the prompts plus its share of the routed experts "
                  "(no AFD; --cuda-devices: one GPU each)")
      ->check(Positive());
  run->add_flag("--enable-expert-parallel", args->enable_expert_parallel,
                "The MoE layers expert-parallel over the --data-parallel-size ranks (default 1: "
                "one rank process)");
  run->add_option("--attention-dp", args->deployment.attention_dp, "Attention DP size")
      ->check(Positive());
  run->add_option("--attention-tp", args->deployment.attention_tp, "Attention TP size")
      ->check(Positive());
  run->add_option("--ffn-dp", args->deployment.ffn_dp, "FFN DP size")->check(Positive());
  run->add_option("--ffn-tp", args->deployment.ffn_tp, "FFN TP size")->check(Positive());
  run->add_option("--cuda-devices", args->deployment.cuda_devices,
                  "With --topology and --device cuda: the CUDA device of each world rank, FFN "
                  "ranks first, then attention ranks (e.g. 0,1 for 1A1F on two GPUs); default: "
                  "every rank on --cuda-device")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  run->add_option("--additional-config", args->deployment.additional_config,
                  "Extra afd fields for --topology, e.g. {\"afd\": "
                  "{\"compute_gate_on_attention\": true}}");
  run->add_flag("--show-rank-map", args->deployment.show_rank_map,
                "With --topology: print the rank map to stderr");
  run->callback([args, &exit_code] { Run(*args, exit_code); });
}

}  // namespace afd::cli

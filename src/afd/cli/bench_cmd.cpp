// `afd bench decode`: decode ms/step per batch size against the memory floor
// (diag/bench_decode.h). `afd bench serve`: load on an OpenAI-compatible server
// (server/client/bench_serve.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "afd/bench_client/bench_serve.h"
#include "afd/cli/commands.h"
#include "afd/cli/generation_flags.h"
#include "afd/cli/validators.h"
#include "afd/common/error.h"
#include "afd/diag/bench_decode.h"
#include "afd/diag/deployment_bench.h"
#include "afd/kernels/backend.h"
#include "afd/model/loader.h"

namespace afd::cli {

namespace {

struct BenchArgs {
  std::string model;
  std::string device = "cpu";
  std::string dtype;
  std::string kv_cache_dtype = "auto";
  std::string quantization;  // --quantization
  int cuda_device = 0;
  std::string batch = "1,16,64,256";
  bool batch_given = false;
  std::string context_mix;                // --context-mix COUNTxLEN,...
  kernels::Backend::FormOverrides forms;  // --mla-splits, --mla-bufs
  std::string cuda_graph_sizes;           // empty: the default capture sizes
  int64_t num_layers = 0;
  diag::BenchDecodeOptions options;
  bool json = false;
  std::string kernel_trace_csv;       // --kernel-trace-csv: every traced kernel of the timed steps
  deploy::DeploymentSpec deployment;  // --topology: through an AFD deployment of this host
  // --data-parallel-size N --enable-expert-parallel: through N data-parallel + expert-parallel
  // rank processes (deployment.expert_parallel_size = N).
  int data_parallel_size = 0;
  bool enable_expert_parallel = false;
};

// --context-mix "1x16384,63x128": (count, prompt tokens) pairs.
std::vector<std::pair<int64_t, int64_t>> ParseContextMix(const std::string& text) {
  std::vector<std::pair<int64_t, int64_t>> mix;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? comma : comma - pos);
    const size_t x = item.find('x');
    long long count = 0, len = 0;
    size_t used_count = 0, used_len = 0;
    try {
      AFD_CHECK(x != std::string::npos, "no x");
      count = std::stoll(item.substr(0, x), &used_count);
      len = std::stoll(item.substr(x + 1), &used_len);
    } catch (const std::exception&) {
      AFD_THROW("--context-mix \"{}\": \"{}\" is not COUNTxTOKENS (e.g. 1x16384,63x128)", text,
                item);
    }
    AFD_CHECK(used_count == x && used_len == item.size() - x - 1 && count >= 1 && len >= 1,
              "--context-mix \"{}\": \"{}\" is not COUNTxTOKENS with both >= 1", text, item);
    mix.emplace_back(count, len);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return mix;
}

std::vector<int64_t> ParseList(const std::string& text, const char* flag) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? comma : comma - pos);
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    AFD_CHECK(used == item.size() && !item.empty() && x >= 1,
              "{} \"{}\": \"{}\" is not a positive integer", flag, text, item);
    v.push_back(x);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

// One line per traced kernel of each batch's timed steps, its times in microseconds from the
// batch's first one: for a timeline or a critical-path reading beyond the printed summary.
void WriteKernelTraceCsv(const std::string& path, const diag::BenchDecodeResult& r) {
  std::ofstream f(path);
  AFD_CHECK(f.good(), "--kernel-trace-csv {}: cannot open it for writing", path);
  f << "batch,stream,start_us,end_us,kernel\n";
  for (const auto& row : r.rows) {
    const auto& spans = row.kernel_trace.spans;
    if (spans.empty()) continue;
    const uint64_t t0 = spans.front().start_ns;
    for (const kernels::KernelSpan& s : spans) {
      std::string name = s.name;
      for (size_t i = name.find('"'); i != std::string::npos; i = name.find('"', i + 2)) {
        name.insert(i, 1, '"');
      }
      f << fmt::format("{},{},{:.3f},{:.3f},\"{}\"\n", row.batch, s.stream,
                       static_cast<double>(s.start_ns - t0) / 1e3,
                       static_cast<double>(s.end_ns - t0) / 1e3, name);
    }
  }
  f.close();
  AFD_CHECK(f.good(), "--kernel-trace-csv {}: writing it failed", path);
}

// The fields every `afd bench decode --json` object starts with.
nlohmann::ordered_json JsonHead(const BenchArgs& a, const std::string& device) {
  nlohmann::ordered_json j;
  j["model"] = a.model;
  j["device"] = device;
  j["context"] = a.options.context;
  if (!a.options.context_mix.empty()) j["context_mix"] = a.options.context_mix;
  j["steps"] = a.options.steps;
  return j;
}

// --topology (or --data-parallel-size N --enable-expert-parallel):
// diag::BenchDecodeOnDeployment with this command's worker flags.
void RunOnTopology(const BenchArgs& a, const std::vector<int64_t>& batches, int& exit_code) {
  const bool cuda = a.device == "cuda";
  diag::DeploymentBenchOptions o;
  o.model = a.model;
  o.num_layers = a.num_layers;
  o.batch_sizes = batches;
  o.context = a.options.context;
  o.steps = a.options.steps;
  o.seed = a.options.seed;
  o.worker_flags = [&](int64_t batch) {
    GenerationFlags g;
    g.model = a.model;
    // The first token comes from the prefill, then the ranks' warm-up and timed decode steps.
    g.max_tokens = 1 + runtime::GenerationStats::kWarmDecodeSteps + a.options.steps;
    g.ignore_eos = true;
    g.num_layers = a.num_layers;
    g.max_num_seqs = batch;
    g.max_num_batched_tokens = batch * a.options.context;
    g.bf16 = !cuda && a.dtype == "bf16";
    g.kv_cache_dtype = a.kv_cache_dtype;
    g.quantization = a.quantization;
    std::vector<std::string> flags = GenerationFlagsArgv(g);
    if (a.options.graphs.enforce_eager) flags.push_back("--enforce-eager");
    if (!a.kernel_trace_csv.empty()) {
      flags.insert(flags.end(),
                   {"--kernel-trace-csv", diag::RankTracePrefix(a.kernel_trace_csv, batch)});
    }
    if (cuda) {
      const std::vector<std::string> f =
          deploy::CudaWorkerFlags(a.deployment, a.cuda_device, a.dtype);
      flags.insert(flags.end(), f.begin(), f.end());
    }
    return flags;
  };
  deploy::DeploymentSpec spec = a.deployment;
  spec.cuda = cuda;
  std::vector<diag::DeploymentBenchRow> rows;
  try {
    rows = diag::BenchDecodeOnDeployment(spec, o);
  } catch (const Error& e) {
    std::cerr << "afd bench decode (" << deploy::DeploymentName(spec) << "): " << e.what() << "\n";
    exit_code = 1;
    return;
  }
  if (!a.kernel_trace_csv.empty()) {
    try {
      diag::MergeRankTraces(a.kernel_trace_csv, batches);
    } catch (const Error& e) {
      std::cerr << "afd bench decode: " << e.what() << "\n";
      exit_code = 1;
      return;
    }
  }
  // Per GPU: what a deployment over several GPUs is compared with (one GPU doing everything).
  const int gpus = deploy::NumGpus(spec);
  if (a.json) {
    nlohmann::ordered_json j = JsonHead(a, a.device);
    j["topology"] = deploy::DeploymentName(spec);
    if (gpus > 0) j["gpus"] = gpus;
    j["rows"] = nlohmann::ordered_json::array();
    for (const diag::DeploymentBenchRow& r : rows) {
      nlohmann::ordered_json row = {{"batch", r.batch},
                                    {"ms_per_step", r.ms_per_step},
                                    {"tokens_per_s", r.tokens_per_s},
                                    {"prefill_tokens_per_s", r.prefill_tokens_per_s}};
      if (gpus > 0) row["tokens_per_s_per_gpu"] = r.tokens_per_s / gpus;
      j["rows"].push_back(row);
    }
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format("{} | {} | {}{} | context {}\n", a.model, a.device,
                             deploy::DeploymentName(spec),
                             gpus > 0 ? fmt::format(" on {} GPU(s)", gpus) : "", a.options.context);
    std::cout << "batch  ms/step  tokens/s  prefill tok/s" << (gpus > 0 ? "  tok/s/GPU" : "")
              << "\n";
    for (const diag::DeploymentBenchRow& r : rows) {
      std::cout << fmt::format("{:5}  {:7.3f}  {:8.1f}  {:13.1f}", r.batch, r.ms_per_step,
                               r.tokens_per_s, r.prefill_tokens_per_s);
      if (gpus > 0) std::cout << fmt::format("  {:9.1f}", r.tokens_per_s / gpus);
      std::cout << "\n";
    }
  }
  exit_code = 0;
}

void Run(BenchArgs a, int& exit_code) {
  try {
    AFD_CHECK(a.data_parallel_size == 0 || a.enable_expert_parallel,
              "--data-parallel-size {} needs --enable-expert-parallel (the ranks' MoE layers "
              "expert-parallel over them)",
              a.data_parallel_size);
    if (a.enable_expert_parallel) {
      a.deployment.expert_parallel_size = std::max(1, a.data_parallel_size);
      deploy::DeploymentSpec ep = a.deployment;
      ep.cuda = a.device == "cuda";
      deploy::CheckDataParallelExpertParallel(ep);
    }
  } catch (const Error& e) {
    std::cerr << "afd bench decode: " << e.what() << "\n";
    exit_code = 2;
    return;
  }
  if (!a.deployment.topology.empty() || a.deployment.expert_parallel_size > 0) {
    std::vector<int64_t> batches;
    try {
      AFD_CHECK(a.context_mix.empty() && a.forms.mla_splits == 0 && a.forms.mla_bufs == 0,
                "--context-mix, --mla-splits and --mla-bufs are one-process options (for now): "
                "leave them out with --topology or --data-parallel-size");
      batches = ParseList(a.batch, "--batch");
      AFD_CHECK(!a.options.profile && !a.options.kernel_trace && a.cuda_graph_sizes.empty(),
                "--profile, --kernel-trace and --cuda-graph-sizes are one-process options; "
                "leave them out with --topology or --data-parallel-size");
      AFD_CHECK(a.kernel_trace_csv.empty() ||
                    (a.device == "cuda" && a.deployment.expert_parallel_size == 0),
                "--kernel-trace-csv with a deployment: an AFD --topology on --device cuda only "
                "(every rank's kernels of the whole run)");
      if (!a.kernel_trace_csv.empty()) {
        AFD_CHECK(std::ofstream(a.kernel_trace_csv).good(),
                  "--kernel-trace-csv {}: cannot open it for writing", a.kernel_trace_csv);
      }
    } catch (const Error& e) {
      std::cerr << "afd bench decode: " << e.what() << "\n";
      exit_code = 2;
      return;
    }
    RunOnTopology(a, batches, exit_code);
    return;
  }
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::MoeModel> model;
  try {
    AFD_CHECK(a.deployment.cuda_devices.empty(),
              "--cuda-devices places the ranks of --topology; one process takes --cuda-device");
    a.options.batch_sizes = ParseList(a.batch, "--batch");
    if (!a.context_mix.empty()) {
      AFD_CHECK(!a.batch_given, "--context-mix sets the batch: leave out --batch");
      a.options.context_mix = ParseContextMix(a.context_mix);
    }
    if (!a.kernel_trace_csv.empty()) {
      a.options.kernel_trace = true;
      AFD_CHECK(std::ofstream(a.kernel_trace_csv).good(),
                "--kernel-trace-csv {}: cannot open it for writing", a.kernel_trace_csv);
    }
    if (!a.cuda_graph_sizes.empty()) {
      a.options.graphs.sizes = ParseList(a.cuda_graph_sizes, "--cuda-graph-sizes");
    }
    const bool cuda = a.device == "cuda";
    model::OpenOptions open;
    open.num_layers = a.num_layers;
    const std::string dtype = !a.dtype.empty() ? a.dtype : cuda ? "bf16" : "";
    if (dtype == "bf16") open.weights.matrix_dtype = DType::kBF16;
    if (dtype == "fp32") open.auto_bf16 = false;
    open.kv_cache_dtype = a.kv_cache_dtype;
    open.weights.fp8_block = QuantizationBlock(a.quantization);
    model::LoadedModel loaded = model::LoadModel(a.model, open, cuda ? a.cuda_device : -1);
    backend = std::move(loaded.backend);
    model = std::move(loaded.model);
    backend->SetFormOverrides(a.forms);
  } catch (const Error& e) {
    std::cerr << "afd bench decode: " << e.what() << "\n";
    exit_code = 2;
    return;
  }
  const diag::BenchDecodeResult r = diag::BenchDecode(*model, a.options);
  if (!a.kernel_trace_csv.empty()) WriteKernelTraceCsv(a.kernel_trace_csv, r);
  if (a.json) {
    nlohmann::ordered_json j = JsonHead(a, r.device);
    j["copy_gb_per_s"] = r.copy_gb_per_s;
    j["rows"] = nlohmann::ordered_json::array();
    for (const auto& row : r.rows) {
      j["rows"].push_back({{"batch", row.batch},
                           {"ms_per_step", row.ms_per_step},
                           {"device_ms_per_step", row.device_ms_per_step},
                           {"host_ms_per_step", row.host_ms_per_step()},
                           {"tokens_per_s", row.tokens_per_s},
                           {"bytes_per_step", row.bytes_per_step},
                           {"floor_ms", row.floor_ms},
                           {"ratio_to_floor", row.ms_per_step / row.floor_ms},
                           {"prefill_tokens_per_s", row.prefill_tokens_per_s},
                           {"prefill_tflops", row.prefill_tflops},
                           {"graph_steps", row.graph_steps},
                           {"ahead_steps", row.ahead_steps}});
    }
    std::cout << j.dump() << "\n";
  } else {
    std::string context = fmt::format("context {}", a.options.context);
    if (!a.options.context_mix.empty()) {
      context = "context mix ";
      for (size_t i = 0; i < a.options.context_mix.size(); ++i) {
        context += fmt::format("{}{}x{}", i == 0 ? "" : "+", a.options.context_mix[i].first,
                               a.options.context_mix[i].second);
      }
    }
    std::cout << fmt::format("{} | {} | {} | copy {:.0f} GB/s\n", a.model, r.device, context,
                             r.copy_gb_per_s);
    // host ms: the step's time not spent in its forward on the device (scheduling, uploads,
    // sampling, reading the ids back: with graphs, the host time not overlapped with the GPU).
    std::cout << "batch  ms/step  host ms  tokens/s  GB/step  floor ms  x floor  prefill tok/s"
                 "  prefill TFLOP/s\n";
    for (const auto& row : r.rows) {
      std::cout << fmt::format(
          "{:5}  {:7.3f}  {:7.3f}  {:8.1f}  {:7.3f}  {:8.3f}  {:7.2f}  {:13.1f}  {:15.1f}\n",
          row.batch, row.ms_per_step, row.host_ms_per_step(), row.tokens_per_s,
          row.bytes_per_step / 1e9, row.floor_ms, row.ms_per_step / row.floor_ms,
          row.prefill_tokens_per_s, row.prefill_tflops);
    }
    const auto print_profile = [](const std::vector<kernels::OpTime>& profile,
                                  const std::string& title) {
      if (profile.empty()) return;
      double total = 0;
      for (const auto& t : profile) total += t.ms;
      std::cout << fmt::format("{} (sum {:.3f})\n", title, total);
      for (size_t i = 0; i < profile.size() && i < 16; ++i) {
        const auto& t = profile[i];
        std::cout << fmt::format("  {:8.3f} ms {:5.1f}%  {:6.1f} calls  {}\n", t.ms,
                                 100.0 * t.ms / total, static_cast<double>(t.calls), t.op);
      }
    };
    for (const auto& row : r.rows) {
      print_profile(row.prefill_profile,
                    fmt::format("profile, batch {}: device ms per prefill step by op ({} steps)",
                                row.batch, row.prefill_steps));
      print_profile(row.profile,
                    fmt::format("profile, batch {}: device ms per decode step by op", row.batch));
      const diag::KernelTraceSummary& k = row.kernel_trace;
      if (k.steps == 0) continue;
      std::cout << fmt::format(
          "kernel trace, batch {}: per decode step ({} graph replays): span {:.3f} ms, idle "
          "{:.3f}, overlapped {:.3f}; ms, alone (no other kernel running), calls, kernel\n",
          row.batch, k.steps, k.span_ms, k.idle_ms, k.overlap_ms);
      for (size_t i = 0; i < k.kernels.size() && i < 24; ++i) {
        const auto& t = k.kernels[i];
        std::cout << fmt::format("  {:8.3f} ms  {:8.3f} alone  {:6.1f}  {}\n", t.ms, t.exclusive_ms,
                                 t.calls, t.name);
      }
    }
  }
  exit_code = 0;
}

// The text of a serve flag as the options struct holds it; errors name the flag.
struct ServeArgs {
  bench_client::BenchServeOptions options;
  std::string request_rate = "inf";
  std::string burstiness = "1.0";
  std::string metric_percentiles = "99";
  std::string percentile_metrics = "ttft,tpot,itl,e2el";
  bool disable_progress = false;
};

double ParseNumber(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  AFD_CHECK(used == text.size() && !text.empty(), "{} \"{}\": not a number", flag, text);
  return v;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    items.push_back(text.substr(pos, comma == std::string::npos ? comma : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return items;
}

void RunServe(ServeArgs a, int& exit_code) {
  bench_client::BenchServeOptions& o = a.options;
  try {
    o.request_rate = ParseNumber("--request-rate", a.request_rate);
    o.burstiness = ParseNumber("--burstiness", a.burstiness);
    o.metric_percentiles.clear();
    for (const std::string& p : SplitCommas(a.metric_percentiles)) {
      o.metric_percentiles.push_back(ParseNumber("--metric-percentiles", p));
    }
    o.percentile_metrics = SplitCommas(a.percentile_metrics);
    o.show_progress = !a.disable_progress;
  } catch (const Error& e) {
    std::cerr << "afd bench serve: " << e.what() << "\n";
    exit_code = 2;
    return;
  }
  exit_code = bench_client::BenchServeMain(o, std::cout, std::cerr);
}

void AddServeCommand(CLI::App& bench, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  bench_client::BenchServeOptions& o = a->options;
  auto* serve = bench.add_subcommand(
      "serve", "Load an OpenAI-compatible server (this runtime's or vLLM's) like vllm bench serve");
  serve->add_option("--base-url", o.base_url, "Server URL, e.g. http://127.0.0.1:8000")->required();
  serve->add_option("--model", o.model,
                    "Model name sent with each request (default: the server's first model)");
  serve->add_option("--endpoint", o.endpoint, "Completions path (default /v1/completions)");
  serve->add_option("--dataset", o.dataset, "random (default) or a .jsonl file of prompts");
  serve->add_option("--num-prompts", o.num_prompts, "Requests to send (default 1000)");
  serve->add_option("--random-input-len", o.random_input_len,
                    "Prompt tokens of the random dataset (default 1024)");
  serve->add_option("--random-output-len", o.random_output_len,
                    "max_tokens per request (default 128; JSONL lines may set their own)");
  serve->add_option("--random-range-ratio", o.random_range_ratio,
                    "Lengths drawn from len*[1-r, 1+r] (default 0)");
  serve->add_option("--random-vocab-size", o.random_vocab_size,
                    "Random prompt ids are drawn from [0, this) (default 1000)");
  serve->add_option("--request-rate", a->request_rate,
                    "Requests per second, or inf to send all at once (default inf)");
  serve->add_option("--burstiness", a->burstiness,
                    "Gamma shape of the arrival gaps; 1 is Poisson (default 1)");
  serve->add_option("--max-concurrency", o.max_concurrency,
                    "Requests in flight at most (default: no cap)");
  serve->add_option("--seed", o.seed, "Seed of the dataset and arrival times (default 0)");
  serve->add_flag("--ignore-eos", o.ignore_eos, "Send ignore_eos: true");
  serve->add_option("--temperature", o.temperature, "Sampling temperature (default 0)");
  serve->add_option("--request-timeout-s", o.request_timeout_s,
                    "Bound on each request in seconds (default 3600)");
  serve->add_option("--api-key", o.api_key, "Bearer token for the server");
  serve->add_option("--result-json", o.result_json, "Write vLLM's result JSON to this file");
  serve->add_option("--plot", o.plot, "Write latency histograms and throughput to this .png");
  serve->add_option("--metric-percentiles", a->metric_percentiles,
                    "Percentiles to report, comma-separated (default 99)");
  serve->add_option("--percentile-metrics", a->percentile_metrics,
                    "Metrics to report: ttft,tpot,itl,e2el (default all four)");
  serve->add_flag("--disable-tqdm", a->disable_progress, "No progress bar");
  serve->callback([a, &exit_code] { RunServe(*a, exit_code); });
}

}  // namespace

void AddBenchCommand(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  auto* decode = bench->add_subcommand(
      "decode",
      "Decode ms/step per batch size against the memory floor (one process, or an AFD "
      "deployment with --topology)");
  decode->add_option("--model", a->model, "Checkpoint directory or preset:NAME")->required();
  decode->add_option("--device", a->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  decode->add_option("--dtype", a->dtype, "bf16 (cuda default) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  AddKvCacheDtypeOption(decode, a->kv_cache_dtype);
  AddQuantizationOption(decode, a->quantization);
  decode->add_option("--cuda-device", a->cuda_device, "CUDA device ordinal")
      ->check(CLI::NonNegativeNumber);
  decode->add_option("--batch", a->batch, "Batch sizes, comma-separated (default 1,16,64,256)")
      ->each([a](const std::string&) { a->batch_given = true; });
  decode->add_option("--context-mix", a->context_mix,
                     "One batch of sequences of different lengths instead of --batch x "
                     "--context: COUNTxTOKENS, comma-separated (e.g. 1x16384,63x128)");
  decode->add_option("--context", a->options.context, "Prompt tokens per sequence (default 128)")
      ->check(Positive());
  decode->add_option("--steps", a->options.steps, "Timed decode steps (default 32)")
      ->check(Positive());
  decode
      ->add_option("--mla-splits", a->forms.mla_splits,
                   "CUDA: MLA decode context splits forced to this count (1..64, at most one per "
                   "tile or chunk), to measure the backend's choice against others")
      ->check(CLI::Range(1, 64));
  decode
      ->add_option("--mla-bufs", a->forms.mla_bufs,
                   "CUDA: the tiled MLA decode kernel's tile buffers forced (1 or 2; chosen by "
                   "the grid otherwise)")
      ->check(CLI::Range(1, 2));
  decode->add_option("--num-layers", a->num_layers, "Keep only the first N decoder layers");
  decode->add_flag("--json", a->json, "One JSON object");
  decode->add_option("--cuda-graph-sizes", a->cuda_graph_sizes,
                     "Decode batch buckets captured as CUDA graphs, comma-separated");
  decode->add_flag("--enforce-eager", a->options.graphs.enforce_eager, "No CUDA graphs");
  decode->add_flag_callback(
      "--async-scheduling", [a] { a->options.async_scheduling = runtime::AsyncScheduling::kOn; },
      "Launch the next decode step before this one's ids are read, also on the CPU (the "
      "default on cuda)");
  decode->add_flag_callback(
      "--no-async-scheduling",
      [a] { a->options.async_scheduling = runtime::AsyncScheduling::kOff; },
      "Read each step's ids back before scheduling the next");
  decode->add_flag("--profile", a->options.profile,
                   "Per-op device time of the decode steps (runs eagerly)");
  decode->add_flag("--kernel-trace", a->options.kernel_trace,
                   "Each kernel's time in the timed steps' CUDA graph replays and the part no "
                   "other kernel overlapped (CUDA: CUPTI, libcupti.so.13 on the library path)");
  decode->add_option("--kernel-trace-csv", a->kernel_trace_csv,
                     "With the kernel trace: write every traced kernel of the timed steps to "
                     "this CSV file (batch, stream, start and end in us, kernel); with "
                     "--topology: every kernel of every rank's whole run (batch, rank, stream, "
                     "graph, launch, start and end in us, kernel)");
  decode->add_option("--topology", a->deployment.topology,
                     "xAyF: through an AFD deployment of rank processes on this host (e.g. "
                     "1A1F with the async connector on one GPU)");
  decode
      ->add_option("--data-parallel-size", a->data_parallel_size,
                   "With --enable-expert-parallel: through that many rank processes, attention "
                   "data-parallel and the MoE expert-parallel over them (the monolithic "
                   "baseline of AFD; --cuda-devices: one GPU each)")
      ->check(Positive());
  decode->add_flag("--enable-expert-parallel", a->enable_expert_parallel,
                   "The MoE layers expert-parallel over the --data-parallel-size ranks (default 1: "
                   "one rank process)");
  decode->add_option("--additional-config", a->deployment.additional_config,
                     "With --topology: extra afd fields (connector, connector_extra_config)");
  decode
      ->add_option("--cuda-devices", a->deployment.cuda_devices,
                   "With --topology and --device cuda: the CUDA device of each world rank, FFN "
                   "ranks first (default: every rank on --cuda-device)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  decode
      ->add_option("--attention-tp", a->deployment.attention_tp,
                   "With --topology: attention ranks per replica")
      ->check(Positive());
  decode->callback([a, &exit_code] { Run(*a, exit_code); });
  AddServeCommand(*bench, exit_code);
}

}  // namespace afd::cli

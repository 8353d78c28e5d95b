// `afd bench decode`: decode ms/step per batch size against the memory floor
// (runtime/bench_decode.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "afd/cli/commands.h"
#include "afd/common/error.h"
#include "afd/kernels/backend.h"
#include "afd/model/loader.h"
#include "afd/runtime/bench_decode.h"

namespace afd::cli {

namespace {

struct BenchArgs {
  std::string model;
  std::string device = "cpu";
  std::string dtype;
  int cuda_device = 0;
  std::string batch = "1,16,64,256";
  std::string cuda_graph_sizes;  // empty: the default capture sizes
  int64_t num_layers = 0;
  runtime::BenchDecodeOptions options;
  bool json = false;
};

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

void Run(BenchArgs a, int& exit_code) {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::DeepseekModel> model;
  try {
    a.options.batch_sizes = ParseList(a.batch, "--batch");
    if (!a.cuda_graph_sizes.empty()) {
      a.options.graphs.sizes = ParseList(a.cuda_graph_sizes, "--cuda-graph-sizes");
    }
    const bool cuda = a.device == "cuda";
    model::OpenOptions open;
    open.num_layers = a.num_layers;
    const std::string dtype = !a.dtype.empty() ? a.dtype : cuda ? "bf16" : "";
    if (dtype == "bf16") open.weights.matrix_dtype = DType::kBF16;
    if (dtype == "fp32") open.auto_bf16 = false;
    backend = kernels::MakeBackend(cuda ? Device::Cuda(a.cuda_device) : Device::Cpu());
    model = model::OpenModel(a.model, open, *backend);
  } catch (const Error& e) {
    std::cerr << "afd bench decode: " << e.what() << "\n";
    exit_code = 2;
    return;
  }
  const runtime::BenchDecodeResult r = runtime::BenchDecode(*model, a.options);
  if (a.json) {
    nlohmann::ordered_json j;
    j["device"] = r.device;
    j["model"] = a.model;
    j["context"] = a.options.context;
    j["steps"] = a.options.steps;
    j["copy_gb_per_s"] = r.copy_gb_per_s;
    j["rows"] = nlohmann::ordered_json::array();
    for (const auto& row : r.rows) {
      j["rows"].push_back({{"batch", row.batch},
                           {"ms_per_step", row.ms_per_step},
                           {"tokens_per_s", row.tokens_per_s},
                           {"bytes_per_step", row.bytes_per_step},
                           {"floor_ms", row.floor_ms},
                           {"ratio_to_floor", row.ms_per_step / row.floor_ms},
                           {"prefill_tokens_per_s", row.prefill_tokens_per_s},
                           {"graph_steps", row.graph_steps}});
    }
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format("{} | {} | context {} | copy {:.0f} GB/s\n", a.model, r.device,
                             a.options.context, r.copy_gb_per_s);
    std::cout << "batch  ms/step  tokens/s  GB/step  floor ms  x floor  prefill tok/s\n";
    for (const auto& row : r.rows) {
      std::cout << fmt::format("{:5}  {:7.3f}  {:8.1f}  {:7.3f}  {:8.3f}  {:7.2f}  {:13.1f}\n",
                               row.batch, row.ms_per_step, row.tokens_per_s,
                               row.bytes_per_step / 1e9, row.floor_ms,
                               row.ms_per_step / row.floor_ms, row.prefill_tokens_per_s);
    }
    for (const auto& row : r.rows) {
      if (row.profile.empty()) continue;
      double total = 0;
      for (const auto& t : row.profile) total += t.ms;
      std::cout << fmt::format("profile, batch {}: device ms per decode step by op (sum {:.3f})\n",
                               row.batch, total);
      for (size_t i = 0; i < row.profile.size() && i < 16; ++i) {
        const auto& t = row.profile[i];
        std::cout << fmt::format("  {:8.3f} ms {:5.1f}%  {:6.1f} calls  {}\n", t.ms,
                                 100.0 * t.ms / total, static_cast<double>(t.calls), t.op);
      }
    }
  }
  exit_code = 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  auto* decode = bench->add_subcommand(
      "decode", "Decode ms/step per batch size against the memory floor (one process)");
  decode->add_option("--model", a->model, "Checkpoint directory or preset:NAME")->required();
  decode->add_option("--device", a->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  decode->add_option("--dtype", a->dtype, "bf16 (cuda default) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  decode->add_option("--cuda-device", a->cuda_device, "CUDA device ordinal")
      ->check(CLI::NonNegativeNumber);
  decode->add_option("--batch", a->batch, "Batch sizes, comma-separated (default 1,16,64,256)");
  decode->add_option("--context", a->options.context, "Prompt tokens per sequence (default 128)")
      ->check(CLI::PositiveNumber);
  decode->add_option("--steps", a->options.steps, "Timed decode steps (default 32)")
      ->check(CLI::PositiveNumber);
  decode->add_option("--num-layers", a->num_layers, "Keep only the first N decoder layers");
  decode->add_flag("--json", a->json, "One JSON object");
  decode->add_option("--cuda-graph-sizes", a->cuda_graph_sizes,
                     "Decode batch buckets captured as CUDA graphs, comma-separated");
  decode->add_flag("--enforce-eager", a->options.graphs.enforce_eager, "No CUDA graphs");
  decode->add_flag("--profile", a->options.profile,
                   "Per-op device time of the decode steps (runs eagerly)");
  decode->callback([a, &exit_code] { Run(*a, exit_code); });
}

}  // namespace afd::cli

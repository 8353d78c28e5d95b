// `afd quantize`: flags to QuantizeCheckpointFp8 (model/quantize.h), the report on stderr.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "afd/cli/commands.h"
#include "afd/model/quantize.h"

namespace afd::cli {

void AddQuantizeCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "quantize",
      "Write an FP8 copy of a checkpoint in DeepSeek-V3's format: every Linear weight but the "
      "routers' as F8_E4M3 with a float32 weight_scale_inv per block (the rounding of "
      "--quantization fp8), other tensors as they are, config.json with quantization_config");
  struct Args {
    std::string model, output;
    int64_t block = 128;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--model", args->model, "Checkpoint directory (fp32, bf16 or fp16)")->required();
  cmd->add_option("--output", args->output, "New (or empty) directory for the FP8 checkpoint")
      ->required();
  cmd->add_option("--block", args->block,
                  "Block size of the scales, square (default 128: DeepSeek-V3's, the one the GPU "
                  "reads without dequantizing)");
  cmd->callback([args, &exit_code] {
    const model::QuantizeReport r =
        model::QuantizeCheckpointFp8(args->model, args->output, args->block);
    std::string dropped;
    for (size_t i = 0; i < r.dropped.size() && i < 4; ++i) {
      dropped += (i ? ", " : "") + r.dropped[i];
    }
    if (r.dropped.size() > 4) dropped += fmt::format(", ... ({} more)", r.dropped.size() - 4);
    const auto size = [](int64_t bytes) {
      return bytes >= (int64_t{1} << 30) ? fmt::format("{:.2f} GiB", bytes / 1073741824.0)
                                         : fmt::format("{:.2f} MiB", bytes / 1048576.0);
    };
    std::fprintf(stderr,
                 "afd quantize: %lld tensors to F8_E4M3 in %lld x %lld blocks, %lld kept; %s -> "
                 "%s of tensors; %zu files copied\n",
                 static_cast<long long>(r.quantized), static_cast<long long>(args->block),
                 static_cast<long long>(args->block), static_cast<long long>(r.kept),
                 size(r.bytes_in).c_str(), size(r.bytes_out).c_str(), r.copied_files.size());
    if (!r.dropped.empty()) {
      std::fprintf(stderr, "afd quantize: not written (the model does not read them): %s\n",
                   dropped.c_str());
    }
    exit_code = 0;
  });
}

}  // namespace afd::cli

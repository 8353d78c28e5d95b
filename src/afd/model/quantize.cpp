#include "afd/model/quantize.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/model/checkpoint.h"
#include "afd/model/loader.h"
#include "afd/model/safetensors.h"
#include "afd/model/weight_builder.h"

namespace afd::model {

namespace {

namespace fs = std::filesystem;

// The builder's walk over the tensors the model reads, recording each as it is written out (the
// builder's own host tensors stay zeros: nothing reads them).
class QuantizingSource : public TensorSource {
 public:
  QuantizingSource(const Checkpoint& ckpt, int64_t block, QuantizeReport& report)
      : ckpt_(ckpt), block_(block), report_(report) {}

  void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind, DType,
            void*) override {
    const TensorInfo& t = ckpt_.Get(name, shape);
    read_.push_back(name);
    report_.bytes_in += static_cast<int64_t>(t.num_bytes);
    const bool router =
        name.size() >= 15 && name.compare(name.size() - 15, 15, "mlp.gate.weight") == 0;
    if (kind != TensorKind::kLinear || shape.size() != 2 || router) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      tensors.push_back({name, t.dtype_name, shape, std::vector<uint8_t>(p, p + t.num_bytes)});
      report_.bytes_out += static_cast<int64_t>(t.num_bytes);
      ++report_.kept;
      return;
    }
    const int64_t rows = shape[0], cols = shape[1];
    const int64_t sr = (rows + block_ - 1) / block_, sc = (cols + block_ - 1) / block_;
    std::vector<float> w(rows * cols);
    ConvertToF32(*t.dtype, t.data, rows * cols, w.data());
    TensorToWrite codes{name, "F8_E4M3", shape, std::vector<uint8_t>(rows * cols)};
    std::vector<float> scales(sr * sc);
    RoundThroughFp8Blocks(w.data(), rows, cols, block_, block_, codes.bytes.data(), scales.data());
    TensorToWrite s{name + "_scale_inv", "F32", {sr, sc}, std::vector<uint8_t>(4 * sr * sc)};
    std::memcpy(s.bytes.data(), scales.data(), s.bytes.size());
    report_.bytes_out += static_cast<int64_t>(codes.bytes.size() + s.bytes.size());
    tensors.push_back(std::move(codes));
    tensors.push_back(std::move(s));
    ++report_.quantized;
  }

  std::vector<TensorToWrite> tensors;
  std::vector<std::string> read_;

 private:
  const Checkpoint& ckpt_;
  int64_t block_;
  QuantizeReport& report_;
};

}  // namespace

QuantizeReport QuantizeCheckpointFp8(const std::string& src, const std::string& dst,
                                     int64_t block) {
  AFD_CHECK(block >= 1 && block <= 1024, "afd quantize: --block {} is outside 1..1024", block);
  AFD_CHECK(!dst.empty(), "afd quantize: no output directory");
  std::error_code ec;
  if (fs::exists(dst)) {
    AFD_CHECK(fs::is_directory(dst) && fs::is_empty(dst),
              "afd quantize: the output {} exists and is not an empty directory", dst);
    AFD_CHECK(!fs::equivalent(src, dst, ec), "afd quantize: the output {} is the source", dst);
  }
  const Checkpoint ckpt = Checkpoint::Open(src);
  ModelConfig config = LoadModelConfig(ckpt.config_path());
  AFD_CHECK(config.fp8_block_n == 0,
            "afd quantize: {} is quantized already (its config.json has a quantization_config)",
            ckpt.config_path());
  ResolveMoeLayerFreq(config, ckpt);
  QuantizeReport report;
  QuantizingSource source(ckpt, block, report);
  WeightOptions options;
  options.matrix_dtype = DType::kBF16;  // the builder's own (unused) copies: half the memory
  (void)BuildWeights(config, options, source);
  std::vector<std::string> read = source.read_;
  std::sort(read.begin(), read.end());
  for (const auto& [name, info] : ckpt.tensors()) {
    if (!std::binary_search(read.begin(), read.end(), name)) report.dropped.push_back(name);
  }
  fs::create_directories(dst);
  WriteSafetensors((fs::path(dst) / "model.safetensors").string(), source.tensors);
  // config.json with the quantization_config the loader reads (DeepSeek-V3's fields).
  std::ifstream in(ckpt.config_path());
  AFD_CHECK(in.good(), "afd quantize: cannot read {}", ckpt.config_path());
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(in);
  j["quantization_config"] = {{"activation_scheme", "dynamic"},
                              {"fmt", "e4m3"},
                              {"quant_method", "fp8"},
                              {"weight_block_size", {block, block}}};
  const fs::path config_out = fs::path(dst) / "config.json";
  std::ofstream out(config_out);
  out << j.dump(2) << "\n";
  AFD_CHECK(out.good(), "afd quantize: writing {} failed", config_out.string());
  // The rest of the directory: tokenizer files, generation_config.json, ...
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {
    const std::string file = e.path().filename().string();
    const bool weights =
        file.size() > 12 && file.compare(file.size() - 12, 12, ".safetensors") == 0;
    if (!e.is_regular_file() || weights || file == "config.json" ||
        file == "model.safetensors.index.json") {
      continue;
    }
    fs::copy_file(e.path(), fs::path(dst) / file, fs::copy_options::overwrite_existing);
    report.copied_files.push_back(file);
  }
  return report;
}

}  // namespace afd::model

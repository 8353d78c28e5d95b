// LoadWeights: TensorSource reading a memory-mapped checkpoint (F32, BF16, F16; F8_E4M3 with
// block scales, dequantized).
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/model/checkpoint.h"
#include "afd/model/weight_builder.h"

namespace afd::model {

namespace {

class CheckpointSource : public TensorSource {
 public:
  CheckpointSource(const ModelConfig& config, const Checkpoint& ckpt)
      : config_(config), ckpt_(ckpt) {}

  void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind, DType dst_type,
            void* dst) override {
    const TensorInfo* fp8 = ckpt_.Find(name);
    if (fp8 != nullptr && fp8->dtype_name == "F8_E4M3") {
      ReadFp8(*fp8, name, shape, dst_type, dst);
      return;
    }
    const TensorInfo& t = ckpt_.Get(name, shape);
    const DType src = *t.dtype;
    const int64_t n = t.numel();
    if (src == dst_type) {
      std::memcpy(dst, t.data, t.num_bytes);
    } else if (dst_type == DType::kF32) {
      ConvertToF32(src, t.data, n, static_cast<float*>(dst));
    } else {  // to bf16, through fp32, in chunks
      constexpr int64_t kChunk = 1 << 16;
      std::vector<float> buf(kChunk);
      auto* out = static_cast<uint16_t*>(dst);
      const auto* in = static_cast<const char*>(t.data);
      for (int64_t i = 0; i < n; i += kChunk) {
        const int64_t m = std::min(kChunk, n - i);
        ConvertToF32(src, in + i * DTypeSize(src), m, buf.data());
        ConvertFromF32(buf.data(), m, DType::kBF16, out + i);
      }
    }
  }

  bool HasFp8(const std::string& name) const override {
    const TensorInfo* t = ckpt_.Find(name);
    return t != nullptr && t->dtype_name == "F8_E4M3" &&
           config_.fp8_block_n == kernels::kFp8WeightBlock &&
           config_.fp8_block_k == kernels::kFp8WeightBlock;
  }

  void ReadFp8(const std::string& name, const std::vector<int64_t>& shape, TensorKind,
               uint8_t* codes, float* scales) override {
    AFD_CHECK(HasFp8(name), "tensor {} is not F8_E4M3 in blocks of {} in the checkpoint", name,
              kernels::kFp8WeightBlock);
    const TensorInfo& t = *ckpt_.Find(name);
    AFD_CHECK(t.shape == shape && shape.size() == 2,
              "{}: tensor {} has shape {}, the config implies {} (FP8 weights are matrices)",
              t.file, name, t.ShapeString(), fmt::format("[{}]", fmt::join(shape, ", ")));
    const TensorInfo& scale = Scales(t, name, shape);
    std::memcpy(codes, t.data, t.num_bytes);
    ConvertToF32(*scale.dtype, scale.data, scale.numel(), scales);
  }

 private:
  // The weight_scale_inv of an F8_E4M3 weight [N, K]: [ceil(N / bn), ceil(K / bk)].
  const TensorInfo& Scales(const TensorInfo& t, const std::string& name,
                           const std::vector<int64_t>& shape) const {
    const int64_t bn = config_.fp8_block_n, bk = config_.fp8_block_k;
    const std::string scale_name = name + "_scale_inv";
    const TensorInfo* s = ckpt_.Find(scale_name);
    AFD_CHECK(s != nullptr, "{}: tensor {} is F8_E4M3 but its scales {} are missing", t.file, name,
              scale_name);
    return ckpt_.Get(scale_name, {(shape[0] + bn - 1) / bn, (shape[1] + bk - 1) / bk});
  }

  // An F8_E4M3 weight [N, K] with its weight_scale_inv [ceil(N / bn), ceil(K / bk)]: w[i][j] =
  // fp8(w[i][j]) * scale_inv[i / bn][j / bk] in fp32 (the edge blocks partial), then dst_type.
  void ReadFp8(const TensorInfo& t, const std::string& name, const std::vector<int64_t>& shape,
               DType dst_type, void* dst) const {
    const int64_t bn = config_.fp8_block_n, bk = config_.fp8_block_k;
    AFD_CHECK(bn > 0 && bk > 0,
              "{}: tensor {} is F8_E4M3, but config.json has no FP8 quantization_config (its "
              "weight_block_size says how the scales apply)",
              t.file, name);
    AFD_CHECK(t.shape == shape && shape.size() == 2,
              "{}: tensor {} has shape {}, the config implies {} (FP8 weights are matrices)",
              t.file, name, t.ShapeString(), fmt::format("[{}]", fmt::join(shape, ", ")));
    const int64_t rows = shape[0], cols = shape[1];
    const std::vector<int64_t> scale_shape = {(rows + bn - 1) / bn, (cols + bk - 1) / bk};
    const TensorInfo& scale = Scales(t, name, shape);
    std::vector<float> scales(scale.numel());
    ConvertToF32(*scale.dtype, scale.data, scale.numel(), scales.data());
    const auto* in = static_cast<const uint8_t*>(t.data);
    std::vector<float> row(cols);
    for (int64_t i = 0; i < rows; ++i) {
      const float* srow = scales.data() + (i / bn) * scale_shape[1];
      for (int64_t j = 0; j < cols; ++j) row[j] = Fp8E4M3ToF32(in[i * cols + j]) * srow[j / bk];
      ConvertFromF32(
          row.data(), cols, dst_type,
          static_cast<char*>(dst) + i * cols * static_cast<int64_t>(DTypeSize(dst_type)));
    }
  }

  const ModelConfig& config_;
  const Checkpoint& ckpt_;
};

}  // namespace

ModelWeights LoadWeights(const ModelConfig& config, const Checkpoint& ckpt,
                         const WeightOptions& options) {
  CheckpointSource source(config, ckpt);
  return BuildWeights(config, options, source);
}

}  // namespace afd::model

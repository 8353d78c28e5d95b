// Internal to the model layer: walks the tensors a config implies and asks a TensorSource for
// each one. Shared by the checkpoint loader and the random-weight generator so that both build
// exactly the same structure.
#pragma once

#include <string>
#include <vector>

#include "afd/model/weights.h"

namespace afd::model {

// What a tensor is, for initialising random weights (a checkpoint ignores it).
enum class TensorKind { kEmbedding, kLinear, kLmHead, kNorm, kBias };

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Writes tensor `name` (which must have `shape`) converted to `dst_type` (kF32 or kBF16),
  // row-major, to dst.
  virtual void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind,
                    DType dst_type, void* dst) = 0;
  // Whether matrix `name` can be read as FP8 E4M3 codes with float32 scales per
  // kernels::kFp8WeightBlock square block (an FP8 checkpoint's tensor with that block size; any
  // Linear weight under --quantization fp8).
  virtual bool HasFp8(const std::string& /*name*/) const { return false; }
  // Such a matrix [rows, cols]: its codes (row-major) to `codes`, its scales [ceil(rows / 128),
  // ceil(cols / 128)] to `scales`; code * scale is what Read gives in fp32.
  virtual void ReadFp8(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind,
                       uint8_t* codes, float* scales);
};

ModelWeights BuildWeights(const ModelConfig& config, const WeightOptions& options,
                          TensorSource& source);

// w [rows, cols] (row-major) rounded through FP8 E4M3 in blocks of bn x bk (edge blocks
// partial): per block scale = max |w| / 448, w = fp8(w / scale) * scale (all in fp32).
// codes / scales, when given: the codes fp8(w / scale) [rows, cols] and the scales
// [ceil(rows / bn), ceil(cols / bk)] as well.
void RoundThroughFp8Blocks(float* w, int64_t rows, int64_t cols, int64_t bn, int64_t bk,
                           uint8_t* codes = nullptr, float* scales = nullptr);

}  // namespace afd::model

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
};

ModelWeights BuildWeights(const ModelConfig& config, const WeightOptions& options,
                          TensorSource& source);

}  // namespace afd::model

// LoadWeights: TensorSource reading a memory-mapped checkpoint.
#include <algorithm>
#include <cstring>
#include <vector>

#include "afd/common/error.h"
#include "afd/model/checkpoint.h"
#include "afd/model/weight_builder.h"

namespace afd::model {

namespace {

class CheckpointSource : public TensorSource {
 public:
  explicit CheckpointSource(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind, DType dst_type,
            void* dst) override {
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
        for (int64_t j = 0; j < m; ++j) out[i + j] = F32ToBf16(buf[j]);
      }
    }
  }

 private:
  const Checkpoint& ckpt_;
};

}  // namespace

ModelWeights LoadWeights(const ModelConfig& config, const Checkpoint& ckpt,
                         const WeightOptions& options) {
  CheckpointSource source(ckpt);
  return BuildWeights(config, options, source);
}

}  // namespace afd::model

// RandomWeights: TensorSource generating deterministic pseudo-random values. Every element is a
// pure function of (seed, tensor name, index) — a counter-based generator — so the values do not
// depend on the thread count or on which other tensors were generated.
#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "afd/model/weight_builder.h"

namespace afd::model {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Uniform in [-1, 1): variance 1/3.
inline float Noise(uint64_t key, uint64_t i) {
  const uint64_t r = SplitMix64(key ^ SplitMix64(i));
  return static_cast<float>(static_cast<double>(r >> 40) * (2.0 / 16777216.0) - 1.0);
}

class RandomSource : public TensorSource {
 public:
  explicit RandomSource(uint64_t seed) : seed_(seed) {}

  void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind,
            DType dst_type, void* dst) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const float sqrt3 = std::sqrt(3.0f);
    const float fan_in = static_cast<float>(shape.back());
    float offset = 0.0f, scale = sqrt3;  // unit variance
    switch (kind) {
      case TensorKind::kEmbedding:
        break;
      case TensorKind::kLinear:
        scale = sqrt3 / std::sqrt(fan_in);
        break;
      case TensorKind::kLmHead:
        scale = 2.0f * sqrt3 / std::sqrt(fan_in);
        break;
      case TensorKind::kNorm:
        offset = 1.0f;
        scale = 0.1f * sqrt3;
        break;
      case TensorKind::kBias:
        scale = 0.1f * sqrt3;
        break;
    }
    const uint64_t key = SplitMix64(seed_ ^ HashName(name));
    auto fill = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float v = offset + scale * Noise(key, i);
        if (dst_type == DType::kF32) {
          static_cast<float*>(dst)[i] = v;
        } else {
          static_cast<uint16_t*>(dst)[i] = F32ToBf16(v);
        }
      }
    };
    const int64_t threads =
        n < (1 << 20) ? 1 : std::max<int64_t>(1, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    const int64_t chunk = (n + threads - 1) / threads;
    for (int64_t t = 1; t < threads; ++t) {
      pool.emplace_back(fill, std::min(n, t * chunk), std::min(n, (t + 1) * chunk));
    }
    fill(0, std::min(n, chunk));
    for (auto& th : pool) th.join();
  }

 private:
  uint64_t seed_;
};

}  // namespace

ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed, const WeightOptions& options) {
  RandomSource source(seed);
  return BuildWeights(config, options, source);
}

}  // namespace afd::model

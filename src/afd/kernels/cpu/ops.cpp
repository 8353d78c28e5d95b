#include "afd/kernels/cpu/ops.h"

#include <cmath>

namespace afd::kernels::cpu {

void RmsNorm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* outr = out + r * dim;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float mean_sq = static_cast<float>(sum_sq / dim);
    const float inv = 1.0f / std::sqrt(mean_sq + eps);
    for (int64_t i = 0; i < dim; ++i) outr[i] = w[i] * (xr[i] * inv);
  }
}

namespace {
inline float Silu(float g) { return g / (1.0f + std::exp(-g)); }
}  // namespace

void SiluMul(const float* gate_up, int64_t n, int64_t inter, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gate_up + r * 2 * inter;
    const float* u = g + inter;
    float* o = out + r * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = Silu(g[i]) * u[i];
  }
}

void SoftmaxInPlace(float* x, int64_t count) {
  float max = x[0];
  for (int64_t i = 1; i < count; ++i) max = std::fmax(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < count; ++i) x[i] *= inv;
}

float Dot(const float* a, const float* b, int64_t count) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < count; ++i, ++j) acc[j] += a[i] * b[i];
  float sum = 0.0f;
  for (int j = 0; j < kLanes; ++j) sum += acc[j];
  return sum;
}

void AddInPlace(float* y, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void AxpyInPlace(float* y, float a, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += a * x[i];
}

int64_t ArgMax(const float* x, int64_t count) {
  int64_t best = 0;
  for (int64_t i = 1; i < count; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace afd::kernels::cpu

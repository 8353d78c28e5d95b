// Elementwise and per-row fp32 ops. All are per-token (per-row) computations in a fixed order,
// so a row's result never depends on the other rows of the batch. Reductions accumulate in
// double: cheap here, and closer to PyTorch's pairwise fp32 sums than a naive fp32 loop.
// Thread safety: pure functions.
#pragma once

#include <cstdint>

namespace afd::kernels::cpu {

// out[r, :] = w * x[r, :] / sqrt(mean(x[r, :]²) + eps), x and out: [n, dim], w: [dim].
// out may alias x.
void RmsNorm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* out);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i] for gate_up: [n, 2·inter] laid out
// as [gate | up] per row; out: [n, inter].
void SiluMul(const float* gate_up, int64_t n, int64_t inter, float* out);

// In place softmax of x[0, count).
void SoftmaxInPlace(float* x, int64_t count);

// Σ a[i]·b[i] over 16 fp32 lanes in a fixed order (vectorizable, deterministic).
float Dot(const float* a, const float* b, int64_t count);

// y[i] += x[i].
void AddInPlace(float* y, const float* x, int64_t count);

// y[i] += a * x[i].
void AxpyInPlace(float* y, float a, const float* x, int64_t count);

// Index of the largest x[i]; the first one on ties (like torch.argmax).
int64_t ArgMax(const float* x, int64_t count);

}  // namespace afd::kernels::cpu

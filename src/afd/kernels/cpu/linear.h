// y = x · Wᵀ for a weight matrix W [out, in] (nn.Linear without bias).
//
// Batch invariance: row i of y depends only on row i of x and on W, bit for bit, whatever n is
// and wherever the row sits in the batch. OpenBLAS picks different kernels (and so different
// summation orders) for different matrix shapes, so Linear always calls sgemm with the same
// shape for a given W: x is cut into blocks of kLinearRowBlock rows (the last one zero-padded)
// and bf16 weights are converted to fp32 in panels of kLinearColBlock rows. This costs extra
// FLOPs for tiny n (decode), where the step is bound by reading the weights anyway.
// Thread safety: reentrant; uses thread-local scratch buffers.
#pragma once

#include <cstdint>

#include "afd/kernels/cpu/matrix.h"

namespace afd::kernels {

inline constexpr int64_t kLinearRowBlock = 16;
inline constexpr int64_t kLinearColBlock = 256;

// x: [n, w.cols()], y: [n, w.rows()] (overwritten); fast path (OpenBLAS), batch-invariant.
void Linear(const float* x, int64_t n, const Matrix& w, float* y);

// The readable reference: one dot product per output, accumulated in double. For tests.
void LinearReference(const float* x, int64_t n, const Matrix& w, float* y);

}  // namespace afd::kernels

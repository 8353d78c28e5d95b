// y = x · Wᵀ for a weight matrix W [out, in] (nn.Linear without bias).
//
// Batch invariance: row i of y depends only on row i of x and on W, bit for bit, whatever n is,
// wherever the row sits in the batch and whatever CPU runs it: Linear is the exact-by-construction
// Gemm of gemm.h (one fixed fma chain per output element).
// Thread safety: reentrant.
#pragma once

#include <cstdint>

#include "afd/kernels/cpu/matrix.h"

namespace afd::kernels {

// x: [n, w.cols()], y: [n, w.rows()] (overwritten).
void Linear(const float* x, int64_t n, const Matrix& w, float* y);

// The readable reference: one dot product per output, accumulated in double. For tests.
void LinearReference(const float* x, int64_t n, const Matrix& w, float* y);

}  // namespace afd::kernels

// The CPU reference GEMM: y[n, n_out] = x[n, k] · Wᵀ for a weight matrix W [n_out, k].
//
// Exact by construction. Every output element is one fixed chain of fp32 fused multiply-adds,
//   y[i][o] = fma(x[i][k-1], W[o][k-1], ... fma(x[i][1], W[o][1], fma(x[i][0], W[o][0], 0)))
// (k ascending, one rounding per term). The chain depends on nothing but row i of x and row o
// of W: not on n, not on the row's place in the batch, not on the thread count, not on the
// instruction set (AVX-512, AVX2+FMA and the portable std::fma loop give the same bits, since a
// fused multiply-add is correctly rounded everywhere). The blocking below (row tiles, column
// panels, k chunks whose partial sums go through y in fp32) only changes which chain is
// advanced when, never a chain itself. No BLAS library is involved, so OPENBLAS_CORETYPE or the
// host CPU cannot change a result.
//
// Speed: W is packed per call into k-major panels of 16 columns (bf16 converted on the fly), the
// micro-kernel keeps a tile of rows x 16 columns in vector registers; column blocks run in
// parallel over OpenMP threads (OMP_NUM_THREADS).
// Thread safety: reentrant (per-thread packing buffers).
#pragma once

#include <cstdint>

#include "afd/common/dtype.h"

namespace afd::kernels::cpu {

// Which micro-kernel runs; every one gives the same bits.
enum class GemmIsa { kAuto, kPortable, kAvx2, kAvx512 };

// The best kernel this CPU supports (kAvx512, kAvx2 or kPortable), at most the one named by
// the environment variable AFD_CPU_GEMM (portable, avx2, avx512) when set.
GemmIsa BestGemmIsa();
const char* GemmIsaName(GemmIsa isa);

// y[i, o] (row stride ldy) = Σ_j x[i, j] · w[o, j] (row stride ldx) in the order above, for
// w: [n_out, k] row-major of w_dtype (kF32 or kBF16). Requires ldx >= k, ldy >= n_out. isa
// kAuto: BestGemmIsa(); a kernel the CPU lacks throws afd::Error.
void Gemm(const float* x, int64_t n, int64_t ldx, const void* w, DType w_dtype, int64_t n_out,
          int64_t k, float* y, int64_t ldy, GemmIsa isa = GemmIsa::kAuto);

// The readable reference: one dot product per output accumulated in double. For tests.
void GemmReference(const float* x, int64_t n, const void* w, DType w_dtype, int64_t n_out,
                   int64_t k, float* y);

}  // namespace afd::kernels::cpu

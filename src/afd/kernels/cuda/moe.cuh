// The MoE experts: permute, grouped GEMMs (mma, tiled, WMMA), the dense tiled Linear, combine
// (moe.cu).
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// moe.cu
// MoePermute's scratch (ints) for n x k slots: 0 when one block groups them (decode sizes), else
// per-block counts. scratch: at least that many ints.
int64_t MoePermuteScratchInts(int64_t n, int64_t k, int64_t num_local);
void LaunchMoePermute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t num_local,
                      int32_t* offsets, int32_t* src_row, int32_t* row_of_slot, int32_t* scratch,
                      cudaStream_t s);
// Both projections of a bf16 expert MLP on tensor cores (mma.sync: GroupedMma up to
// kMmaMaxAvgRows rows per expert on average, GroupedTiled above), when both shapes fit (else
// false, nothing launched): x rounded to bf16 once into x_bf16 [m, h], the SwiGLU product
// written as bf16 into act_bf16 [m, inter] by the first GEMM (rounded as the separate
// conversion would: the same bits), then out [m, h] = act · W_down^T. No fp32 intermediate.
// src_row: null, or row r of the rows is x[src_row[r]] (gathered while rounded).
// gate_up_scale / down_scale: null (bf16 weights), or the FP8 experts' block scales (E4M3
// weights, kernels::ExpertWeights' layout; sm_89+): w8a8 at every size -- x and then the SwiGLU
// product (fp32 in act_bf16, which must hold m x inter floats) quantized to E4M3 rows with a
// scale per 128 (RowsToFp8, into x_bf16: m x max(h, inter) x 2 bytes) for GroupedMmaFp8.
bool LaunchGroupedMlpMma(const float* x, const int32_t* src_row, int64_t m, int64_t h,
                         int64_t inter, const void* const* gate_up, const void* const* down,
                         const void* const* gate_up_scale, const void* const* down_scale,
                         const int32_t* offsets, int64_t num_local, uint16_t* x_bf16,
                         uint16_t* act_bf16, float* out, cudaStream_t s);
// Whether both projections of an expert MLP take the tiled form (prefill sizes: over
// kMmaMaxAvgRows rows per expert on average).
bool GroupedMlpTiledFits(int64_t m, int64_t h, int64_t inter, int64_t num_local);
// FP8 experts' codes [rows, cols] (by pointer table, with their block scales; rows from `split`
// on start new block rows) as bf16 into out [num_local, rows, cols]: the values a dequantizing
// load holds (so the tiled form then gives the bf16 experts' bits).
void LaunchDequantFp8Experts(const void* const* codes, const void* const* scales, int64_t num_local,
                             int64_t rows, int64_t cols, int64_t split, uint16_t* out,
                             cudaStream_t s);
// Dense y[n, m] = x · w^T on the tiled bf16 kernel (GroupedTiled with one weight matrix): x_bf16
// [n, k] (x already rounded), w bf16 [m, k], y fp32. For prefill-sized n, where cuBLAS's choice
// for N off its 128 grid runs at a few % of the tensor cores (kv_a's N = 576).
bool TiledLinearFits(int64_t n, int64_t k, int64_t m);
void LaunchTiledLinear(const uint16_t* x_bf16, int64_t n, int64_t k, const void* w, int64_t m,
                       float* y, cudaStream_t s);
// Grouped y[r] = x[r] · W_e^T for the rows of each expert; weights by pointer table
// (w_ptrs[e], bf16 or f32 [N, K]). swiglu: W is [2N', K] gate|up and y[r, c] =
// silu(gate_c) · up_c for c < N' = n_out. x_bf16: device scratch of m·k bf16 (or null): with
// bf16 weights and decode-sized groups, x is rounded to bf16 there first (as the tensor-core
// path does).
void LaunchGroupedLinear(const float* x, int64_t m, int64_t k, const void* const* w_ptrs, bool bf16,
                         const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                         float* y, uint16_t* x_bf16, cudaStream_t s);
// addend: null, or [n, h] added to each output row after its weighted sum.
void LaunchMoeCombine(const float* y, int64_t h, const int32_t* row_of_slot, const float* weights,
                      int64_t n, int64_t k, bool accumulate, const float* addend, float* out,
                      cudaStream_t s);

}  // namespace afd::kernels::cuda

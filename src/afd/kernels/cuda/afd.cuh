// The AFD exchange ops (afd.cu): the attention role's dispatch and combine (kernels/backend.h).
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// afd.cu: the AFD exchange ops (kernels/backend.h). Per-rank pointers by value (at most
// Backend::kMaxAfdRanks = 64 ranks).
struct AfdRankPtrs {
  void* p[64];
};
struct AfdRankInts {
  int64_t v[64];
};
// bf16_mask bit f: rank f's rows are bf16; fp8_mask bit f: FP8 with scales.p[f] (else f32).
void LaunchAfdDispatch(const float* hidden, const int32_t* ids, const float* weights, int64_t n,
                       int64_t k, int64_t h, int64_t num_experts, int num_ranks,
                       const AfdRankPtrs& rows, uint64_t bf16_mask, uint64_t fp8_mask,
                       const AfdRankPtrs& scales, const AfdRankPtrs& tables, int32_t* send_row,
                       bool shared, cudaStream_t s);
void LaunchAfdSumPartials(const AfdRankPtrs& partials, const int32_t* send_row, int64_t n,
                          int64_t h, int num_ranks, float* out, cudaStream_t s);
// shared_idx may be null.
void LaunchAfdPairIndex(const int32_t* ids, int64_t n, int64_t k, int64_t num_experts,
                        int num_ranks, const int32_t* send_row, const AfdRankPtrs& row_of_slot,
                        const AfdRankInts& base, const AfdRankInts& shared_base, int32_t* idx,
                        int32_t* shared_idx, cudaStream_t s);
// out = the FP8 dispatch's rows q [m, h] read with their group scales (afd_exchange.h).
void LaunchDequantFp8Rows(const uint8_t* q, const float* scales, int64_t m, int64_t h, float* out,
                          cudaStream_t s);
void LaunchBf16ToF32(const uint16_t* x, int64_t n, float* out, cudaStream_t s);

}  // namespace afd::kernels::cuda

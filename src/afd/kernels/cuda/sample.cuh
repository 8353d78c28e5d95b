// Outputs: log-softmax at ids, argmax, TakeIds, sampling (sample.cu).
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// sample.cu
// LogSoftmaxAt and ArgMax reduce each row in chunks, then merge the chunks: scratch holds
// SampleReduceBytes(n, v) of device memory for the chunks' partial results.
size_t SampleReduceBytes(int64_t n, int64_t v);
void LaunchLogSoftmaxAt(const float* logits, int64_t n, int64_t v, const int32_t* ids, float* out,
                        void* scratch, cudaStream_t s);
void LaunchArgMax(const float* logits, int64_t n, int64_t v, int32_t* ids, void* scratch,
                  cudaStream_t s);
// ids[t] = from[source[t]] where source[t] >= 0 (Backend::TakeIds).
void LaunchTakeIds(const int32_t* from, const int32_t* source, int64_t n, int32_t* ids,
                   cudaStream_t s);
// Rows with temperature > 0: sorted (keys descending, NaN as -inf) candidates per row, then the
// CPU backend's top-k / top-p / inverse-CDF rule with the row's u. params: [n, 4] f32
// (temperature, top_k, top_p, u as float) ... u kept in double: u: [n] f64.
struct SampleParamsDev {
  const float* temperature;  // [n]
  const int64_t* top_k;      // [n]
  const float* top_p;        // [n]
  const double* u;           // [n]
};
// sorted_logits / sorted_ids: [n, v] each row sorted descending (stable: ties by ascending id).
void LaunchSampleSorted(const float* sorted_logits, const int32_t* sorted_ids, int64_t n, int64_t v,
                        const SampleParamsDev& p, int32_t* ids, cudaStream_t s);
// keys[r, i] = logits[r, i] with NaN -> -inf; vals[r, i] = i; offsets[r] = r·v (n + 1 entries).
void LaunchPrepareSort(const float* logits, int64_t n, int64_t v, float* keys, int32_t* vals,
                       int32_t* offsets, cudaStream_t s);
// Bytes of temporary storage the segmented sort needs, and the sort itself.
size_t SegmentedSortTempBytes(int64_t n, int64_t v);
void SegmentedSortDescending(void* temp, size_t temp_bytes, const float* keys_in, float* keys_out,
                             const int32_t* vals_in, int32_t* vals_out, int64_t n, int64_t v,
                             const int32_t* offsets, cudaStream_t s);

}  // namespace afd::kernels::cuda

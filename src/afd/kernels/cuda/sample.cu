// Log-softmax at ids and token selection on the GPU: greedy argmax (NaN never wins, first
// maximum), and for sampled rows the CPU reference's rule over candidates sorted on the device.
#include <cfloat>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/launch.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ float Key(float v) { return isnan(v) ? -INFINITY : v; }

__global__ void LogSoftmaxAt(const float* logits, int64_t v, const int32_t* ids, float* out) {
  __shared__ float smax[kThreads];
  __shared__ double ssum[kThreads];
  const float* x = logits + blockIdx.x * v;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) m = fmaxf(m, x[i]);
  smax[threadIdx.x] = m;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) smax[threadIdx.x] = fmaxf(smax[threadIdx.x], smax[threadIdx.x + o]);
    __syncthreads();
  }
  const float mx = smax[0];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) s += exp(double(x[i]) - mx);
  ssum[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) ssum[threadIdx.x] += ssum[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    out[blockIdx.x] = static_cast<float>(x[ids[blockIdx.x]] - (log(ssum[0]) + mx));
}

__global__ void ArgMax(const float* logits, int64_t v, int32_t* ids) {
  __shared__ float sval[kThreads];
  __shared__ int64_t sidx[kThreads];
  const float* x = logits + blockIdx.x * v;
  float best = -INFINITY;
  int64_t bi = -1;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
    const float k = Key(x[i]);
    if (bi < 0 || k > best) {
      best = k;
      bi = i;
    }
  }
  sval[threadIdx.x] = best;
  sidx[threadIdx.x] = bi;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) {
      const float bv = sval[threadIdx.x + o];
      const int64_t bj = sidx[threadIdx.x + o];
      const int64_t aj = sidx[threadIdx.x];
      if (bj >= 0 && (aj < 0 || bv > sval[threadIdx.x] || (bv == sval[threadIdx.x] && bj < aj))) {
        sval[threadIdx.x] = bv;
        sidx[threadIdx.x] = bj;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = static_cast<int32_t>(sidx[0] < 0 ? 0 : sidx[0]);
}

__global__ void PrepareSort(const float* logits, int64_t n, int64_t v, float* keys, int32_t* vals,
                            int32_t* offsets) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * v;
       i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = Key(logits[i]);
    vals[i] = static_cast<int32_t>(i % v);
  }
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r <= n;
       r += int64_t(gridDim.x) * blockDim.x) {
    offsets[r] = static_cast<int32_t>(r * v);
  }
}

// One thread per row (greedy rows are left as ArgMax wrote them).
__global__ void SampleSorted(const float* keys, const int32_t* sorted_ids, int64_t n, int64_t v,
                             SampleParamsDev p, int32_t* ids) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n || !(p.temperature[r] > 0.0f)) return;
  const float* key = keys + r * v;
  const int32_t* cand = sorted_ids + r * v;
  const int64_t k = p.top_k[r] > 0 ? min(p.top_k[r], v) : v;
  const double max = key[0], t = p.temperature[r];
  if (!isfinite(max)) {
    ids[r] = cand[0];
    return;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += exp((key[i] - max) / t);
  int64_t keep = k;
  double cumulative = 0.0, kept_sum = sum;
  for (int64_t i = 0; i < k; ++i) {
    cumulative += exp((key[i] - max) / t) / sum;
    if (cumulative >= p.top_p[r]) {
      keep = i + 1;
      kept_sum = 0.0;
      for (int64_t j = 0; j < keep; ++j) kept_sum += exp((key[j] - max) / t);
      break;
    }
  }
  const double u = p.u[r] * kept_sum;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += exp((key[i] - max) / t);
    if (u < acc) {
      ids[r] = cand[i];
      return;
    }
  }
  ids[r] = cand[keep - 1];
}

}  // namespace

void LaunchLogSoftmaxAt(const float* logits, int64_t n, int64_t v, const int32_t* ids, float* out,
                        cudaStream_t s) {
  if (n == 0) return;
  LogSoftmaxAt<<<static_cast<unsigned>(n), kThreads, 0, s>>>(logits, v, ids, out);
  CheckLaunch("LogSoftmaxAt");
}

void LaunchArgMax(const float* logits, int64_t n, int64_t v, int32_t* ids, cudaStream_t s) {
  if (n == 0) return;
  ArgMax<<<static_cast<unsigned>(n), kThreads, 0, s>>>(logits, v, ids);
  CheckLaunch("ArgMax");
}

void LaunchPrepareSort(const float* logits, int64_t n, int64_t v, float* keys, int32_t* vals,
                       int32_t* offsets, cudaStream_t s) {
  PrepareSort<<<1024, kThreads, 0, s>>>(logits, n, v, keys, vals, offsets);
  CheckLaunch("PrepareSort");
}

size_t SegmentedSortTempBytes(int64_t n, int64_t v) {
  size_t bytes = 0;
  AFD_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(n * v),
      static_cast<int>(n), static_cast<const int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr) + 1));
  return bytes;
}

void SegmentedSortDescending(void* temp, size_t temp_bytes, const float* keys_in, float* keys_out,
                             const int32_t* vals_in, int32_t* vals_out, int64_t n, int64_t v,
                             const int32_t* offsets, cudaStream_t s) {
  AFD_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, static_cast<int>(n * v),
      static_cast<int>(n), offsets, offsets + 1, 0, sizeof(float) * 8, s));
}

void LaunchSampleSorted(const float* sorted_logits, const int32_t* sorted_ids, int64_t n, int64_t v,
                        const SampleParamsDev& p, int32_t* ids, cudaStream_t s) {
  if (n == 0) return;
  SampleSorted<<<static_cast<unsigned>((n + 63) / 64), 64, 0, s>>>(sorted_logits, sorted_ids, n, v,
                                                                   p, ids);
  CheckLaunch("SampleSorted");
}

}  // namespace afd::kernels::cuda

// Log-softmax at ids and token selection on the GPU: greedy argmax (NaN never wins, first
// maximum), and for sampled rows the CPU reference's rule over candidates sorted on the device.
#include <algorithm>
#include <cfloat>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/pdl.cuh"
#include "afd/kernels/cuda/sample.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ float Key(float v) { return isnan(v) ? -INFINITY : v; }

// Log-softmax and argmax read a row in chunks of kChunk logits, one block per (chunk, row), then
// one warp per row merges the chunks in chunk order: a row of 102400 logits is 25 blocks, not
// one block reading it alone (which took 0.26 + 0.16 ms per step). The result of a row depends
// on that row alone (fixed chunks, fixed reduction order), whatever the batch.
constexpr int64_t kChunk = 16 * kThreads;

__device__ int64_t Chunks(int64_t v) { return (v + kChunk - 1) / kChunk; }

// Block-wide reductions in a fixed order: each warp by shuffles, then warp 0 over the warps.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T* shared /* [kThreads / 32] */) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = shared[0];
  for (int w = 1; w < kThreads / 32; ++w) total = op(total, shared[w]);
  return total;
}

// Chunk c of row r (block (r, c)): its max m and sum of exp(x - m) in double (0 when every
// logit is -inf; NaN when one is NaN, which then makes the row's result NaN, as on the CPU).
__global__ void __launch_bounds__(kThreads)
    LogSoftmaxPartial(const float* logits, int64_t v, double* part) {
  PdlStart();
  __shared__ float smax[kThreads / 32];
  __shared__ double ssum[kThreads / 32];
  const int64_t r = blockIdx.x, c = blockIdx.y;
  const float* x = logits + r * v;
  const int64_t begin = c * kChunk, end = min(v, begin + kChunk);
  float m = -INFINITY, has_nan = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    m = fmaxf(m, x[i]);
    if (isnan(x[i])) has_nan = 1.0f;
  }
  const auto max = [](float a, float b) { return fmaxf(a, b); };
  m = BlockReduce(m, max, smax);
  has_nan = BlockReduce(has_nan, max, smax);
  double s = 0.0;
  if (has_nan != 0.0f) {
    s = nan("");
  } else if (m != -INFINITY) {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) s += exp(double(x[i]) - m);
  }
  s = BlockReduce(
      s, [](double a, double b) { return a + b; }, ssum);
  if (threadIdx.x == 0) {
    part[2 * (r * gridDim.y + c)] = m;
    part[2 * (r * gridDim.y + c) + 1] = s;
  }
}

// One warp per row: M = max of the chunks' maxima, S = sum of s_c e^{m_c - M} (lanes take chunks
// lane, lane + 32, ..., then a fixed shuffle tree), out = x[id] - (log S + M).
__global__ void LogSoftmaxFinish(const float* logits, int64_t v, const double* part,
                                 const int32_t* ids, float* out) {
  PdlStart();
  const int64_t r = blockIdx.x, chunks = Chunks(v);
  const int lane = threadIdx.x;
  const double* p = part + 2 * r * chunks;
  double m = -INFINITY;
  for (int64_t c = lane; c < chunks; c += 32) m = fmax(m, p[2 * c]);
  for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
  double s = 0.0;
  for (int64_t c = lane; c < chunks; c += 32) {
    if (p[2 * c + 1] != 0.0) s += p[2 * c + 1] * exp(p[2 * c] - m);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) out[r] = static_cast<float>(logits[r * v + ids[r]] - (log(s) + m));
}

// The better of two (value, index) candidates: the larger value, on a tie the lower index.
__device__ void Better(float& bv, int64_t& bi, float v, int64_t i) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

// Chunk c of row r (block (r, c)): its first maximum (NaN counts as -inf; a chunk of -inf gives
// its first index), written as (value, index).
__global__ void __launch_bounds__(kThreads)
    ArgMaxPartial(const float* logits, int64_t v, float* part_v, int64_t* part_i) {
  PdlStart();
  __shared__ float sval[kThreads / 32];
  __shared__ int64_t sidx[kThreads / 32];
  const int64_t r = blockIdx.x, c = blockIdx.y;
  const float* x = logits + r * v;
  const int64_t begin = c * kChunk, end = min(v, begin + kChunk);
  float best = -INFINITY;
  int64_t bi = INT64_MAX;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) Better(best, bi, Key(x[i]), i);
  for (int o = 16; o > 0; o >>= 1) {
    Better(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sval[warp] = best;
    sidx[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) Better(best, bi, sval[w], sidx[w]);
  part_v[r * gridDim.y + c] = best;
  part_i[r * gridDim.y + c] = bi;
}

// One warp per row: the best of the chunks' candidates.
__global__ void ArgMaxFinish(int64_t v, const float* part_v, const int64_t* part_i, int32_t* ids) {
  PdlStart();
  const int64_t r = blockIdx.x, chunks = Chunks(v);
  float best = -INFINITY;
  int64_t bi = INT64_MAX;
  for (int64_t c = threadIdx.x; c < chunks; c += 32) {
    Better(best, bi, part_v[r * chunks + c], part_i[r * chunks + c]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    Better(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
  }
  if (threadIdx.x == 0) ids[r] = static_cast<int32_t>(bi == INT64_MAX ? 0 : bi);
}

__global__ void PrepareSort(const float* logits, int64_t n, int64_t v, float* keys, int32_t* vals,
                            int32_t* offsets) {
  PdlStart();
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
  PdlStart();
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

size_t SampleReduceBytes(int64_t n, int64_t v) {
  return static_cast<size_t>(n * ((v + kChunk - 1) / kChunk)) * 2 * sizeof(double);
}

void LaunchLogSoftmaxAt(const float* logits, int64_t n, int64_t v, const int32_t* ids, float* out,
                        void* scratch, cudaStream_t s) {
  if (n == 0) return;
  auto* part = static_cast<double*>(scratch);
  // Rows on x (up to 2^31 - 1 of them: every prompt position of a long prompt), chunks on y.
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((v + kChunk - 1) / kChunk));
  LaunchPdl(LogSoftmaxPartial, grid, kThreads, 0, s, logits, v, part);
  LaunchPdl(LogSoftmaxFinish, static_cast<unsigned>(n), 32, 0, s, logits, v, part, ids, out);
  CheckLaunch("LogSoftmaxAt");
}

void LaunchArgMax(const float* logits, int64_t n, int64_t v, int32_t* ids, void* scratch,
                  cudaStream_t s) {
  if (n == 0) return;
  const int64_t chunks = (v + kChunk - 1) / kChunk;
  auto* part_i = static_cast<int64_t*>(scratch);
  auto* part_v = reinterpret_cast<float*>(part_i + n * chunks);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(chunks));
  LaunchPdl(ArgMaxPartial, grid, kThreads, 0, s, logits, v, part_v, part_i);
  LaunchPdl(ArgMaxFinish, static_cast<unsigned>(n), 32, 0, s, v, part_v, part_i, ids);
  CheckLaunch("ArgMax");
}

__global__ void TakeIdsKernel(const int32_t* from, const int32_t* source, int64_t n, int32_t* ids) {
  PdlStart();
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t src = source[t];
    if (src >= 0) ids[t] = from[src];
  }
}

void LaunchTakeIds(const int32_t* from, const int32_t* source, int64_t n, int32_t* ids,
                   cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 1024);
  LaunchPdl(TakeIdsKernel, static_cast<unsigned>(blocks), 256, 0, s, from, source, n, ids);
  CheckLaunch("TakeIds");
}

void LaunchPrepareSort(const float* logits, int64_t n, int64_t v, float* keys, int32_t* vals,
                       int32_t* offsets, cudaStream_t s) {
  LaunchPdl(PrepareSort, 1024, kThreads, 0, s, logits, n, v, keys, vals, offsets);
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
  LaunchPdl(SampleSorted, static_cast<unsigned>((n + 63) / 64), 64, 0, s, sorted_logits, sorted_ids,
            n, v, p, ids);
  CheckLaunch("SampleSorted");
}

}  // namespace afd::kernels::cuda

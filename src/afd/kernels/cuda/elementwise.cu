// Elementwise and per-row ops of the CUDA backend: fill, add, SiLU·mul, bf16 conversion,
// embedding, row gather, RMSNorm.
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/elementwise.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}

__global__ void Fill(float* x, int64_t n, float v) {
  PdlStart();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}

__global__ void Add(float* y, const float* x, int64_t n) {
  PdlStart();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void SiluMul(const float* gu, int64_t n, int64_t inter, float* out) {
  PdlStart();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * inter;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, c = i % inter;
    const float g = gu[r * 2 * inter + c], u = gu[r * 2 * inter + inter + c];
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void ToBf16(const float* x, int64_t n, __nv_bfloat16* out) {
  PdlStart();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

__global__ void Embedding(const void* table, bool bf16, const int32_t* ids, int64_t h, float* out) {
  PdlStart();
  const int64_t row = ids[blockIdx.x];
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    out[blockIdx.x * h + j] =
        bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(table)[row * h + j])
             : static_cast<const float*>(table)[row * h + j];
  }
}

__global__ void Gather(const float* x, const int32_t* index, int64_t h, float* out) {
  PdlStart();
  const int64_t r = index[blockIdx.x];
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) out[blockIdx.x * h + j] = x[r * h + j];
}

__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += partial[w];
  return total;
}

// One block per row. kVec = 4: 16-byte loads (d % 4 == 0, aligned rows), a thread's first
// kHeld vectors kept in registers between the sum of squares and the scaling. add (AddRmsNorm):
// the row of add is added to x's first (x += add, stored back), and the sum is normalised.
template <int kVec>
__global__ void RmsNorm(float* x, const float* add, int64_t d, const float* w, float eps,
                        float* out) {
  PdlStart();
  using V = std::conditional_t<kVec == 4, float4, float>;
  constexpr int kHeld = 4;
  const int64_t dv = d / kVec;
  V* xr = reinterpret_cast<V*>(x + blockIdx.x * d);
  const V* ar = add ? reinterpret_cast<const V*>(add + blockIdx.x * d) : nullptr;
  // x[j] (+ add[j], stored back into x: the same rounding as Add).
  const auto load = [&](int64_t j) {
    V v = xr[j];
    if (ar != nullptr) {
      const V a = ar[j];
      float* e = reinterpret_cast<float*>(&v);
      const float* ae = reinterpret_cast<const float*>(&a);
#pragma unroll
      for (int i = 0; i < kVec; ++i) e[i] += ae[i];
      xr[j] = v;
    }
    return v;
  };
  V held[kHeld];
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < kHeld; ++u) {
    const int64_t j = threadIdx.x + int64_t(u) * blockDim.x;
    if (j < dv) held[u] = load(j);
  }
#pragma unroll
  for (int u = 0; u < kHeld; ++u) {
    const int64_t j = threadIdx.x + int64_t(u) * blockDim.x;
    if (j >= dv) break;
    const float* e = reinterpret_cast<const float*>(&held[u]);
#pragma unroll
    for (int i = 0; i < kVec; ++i) ss += e[i] * e[i];
  }
  for (int64_t j = threadIdx.x + int64_t(kHeld) * blockDim.x; j < dv; j += blockDim.x) {
    const V v = load(j);  // the thread's own store: re-read below as stored
    const float* e = reinterpret_cast<const float*>(&v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) ss += e[i] * e[i];
  }
  const float inv = rsqrtf(BlockSum(ss) / d + eps);
  V* o = reinterpret_cast<V*>(out + blockIdx.x * d);
  const V* wv = reinterpret_cast<const V*>(w);
  const auto scale = [&](int64_t j, V v) {
    const V g = wv[j];
    float* e = reinterpret_cast<float*>(&v);
    const float* ge = reinterpret_cast<const float*>(&g);
#pragma unroll
    for (int i = 0; i < kVec; ++i) e[i] = ge[i] * (e[i] * inv);
    o[j] = v;
  };
#pragma unroll
  for (int u = 0; u < kHeld; ++u) {
    const int64_t j = threadIdx.x + int64_t(u) * blockDim.x;
    if (j < dv) scale(j, held[u]);
  }
  for (int64_t j = threadIdx.x + int64_t(kHeld) * blockDim.x; j < dv; j += blockDim.x) {
    scale(j, xr[j]);
  }
}

}  // namespace

void CheckLaunch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  AFD_CHECK(e == cudaSuccess, "CUDA kernel {} failed to launch: {}", what, cudaGetErrorString(e));
}

namespace {
thread_local bool pdl_for_thread = false;
}  // namespace

void SetPdlForThread(bool on) { pdl_for_thread = on; }

namespace {

// Writes __CUDA_ARCH__ of the code the device runs (0 on the host pass), + 1 where that code has
// sm_90a's features.
__global__ void CodeProbe(int* out) {
#if defined(__CUDA_ARCH__)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = __CUDA_ARCH__ + 1;
#else
  *out = __CUDA_ARCH__;
#endif
#endif
}

}  // namespace

RunningCode ProbeRunningCode() {
  static const RunningCode code = [] {
    int* flag = nullptr;
    int v = 0;
    AFD_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    CodeProbe<<<1, 1>>>(flag);
    const cudaError_t launched = cudaGetLastError();
    const cudaError_t copied = cudaMemcpy(&v, flag, sizeof(int), cudaMemcpyDeviceToHost);
    AFD_CUDA_CHECK(cudaFree(flag));
    AFD_CUDA_CHECK(launched);
    AFD_CUDA_CHECK(copied);
    return RunningCode{v / 10 * 10, v % 10 == 1};
  }();
  return code;
}

bool PdlEnabled() {
  static const bool off = ChoiceOff("AFD_PDL");
  if (off || !pdl_for_thread) return false;
  // Per device (compute capability 9.0+), looked up once each.
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices];  // 0 unknown, 1 off, 2 on
  int device = 0;
  AFD_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kDevices) return false;
  int state = known[device].load(std::memory_order_relaxed);
  if (state == 0) {
    int major = 0;
    AFD_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    state = major >= 9 ? 2 : 1;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state == 2;
}

void LaunchFill(float* x, int64_t n, float value, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(Fill, Blocks(n), kThreads, 0, s, x, n, value);
  CheckLaunch("Fill");
}

void LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(Add, Blocks(n), kThreads, 0, s, y, x, n);
  CheckLaunch("Add");
}

void LaunchSiluMul(const float* gate_up, int64_t n, int64_t inter, float* out, cudaStream_t s) {
  if (n * inter == 0) return;
  LaunchPdl(SiluMul, Blocks(n * inter), kThreads, 0, s, gate_up, n, inter, out);
  CheckLaunch("SiluMul");
}

void LaunchToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(ToBf16, Blocks(n), kThreads, 0, s, x, n, reinterpret_cast<__nv_bfloat16*>(out));
  CheckLaunch("ToBf16");
}

void LaunchEmbedding(const void* table, bool bf16, const int32_t* ids, int64_t n, int64_t h,
                     float* out, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(Embedding, static_cast<unsigned>(n), kThreads, 0, s, table, bf16, ids, h, out);
  CheckLaunch("Embedding");
}

void LaunchGatherRows(const float* x, const int32_t* index, int64_t m, int64_t h, float* out,
                      cudaStream_t s) {
  if (m == 0) return;
  LaunchPdl(Gather, static_cast<unsigned>(m), kThreads, 0, s, x, index, h, out);
  CheckLaunch("GatherRows");
}

namespace {

// x [n, d] (+= add when given) normalised into out.
void LaunchNorm(float* x, const float* add, int64_t n, int64_t d, const float* w, float eps,
                float* out, cudaStream_t s) {
  if (n == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec4 =
      d % 4 == 0 && aligned(x) && aligned(w) && aligned(out) && (add == nullptr || aligned(add));
  if (vec4) {
    LaunchPdl(RmsNorm<4>, static_cast<unsigned>(n), kThreads, 0, s, x, add, d, w, eps, out);
  } else {
    LaunchPdl(RmsNorm<1>, static_cast<unsigned>(n), kThreads, 0, s, x, add, d, w, eps, out);
  }
}

}  // namespace

void LaunchRmsNorm(const float* x, int64_t n, int64_t d, const float* w, float eps, float* out,
                   cudaStream_t s) {
  // Without an add, x is only read.
  LaunchNorm(const_cast<float*>(x), nullptr, n, d, w, eps, out, s);
  CheckLaunch("RmsNorm");
}

void LaunchAddRmsNorm(float* y, const float* x, int64_t n, int64_t d, const float* w, float eps,
                      float* out, cudaStream_t s) {
  LaunchNorm(y, x, n, d, w, eps, out, s);
  CheckLaunch("AddRmsNorm");
}

}  // namespace afd::kernels::cuda

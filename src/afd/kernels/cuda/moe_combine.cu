// MoeCombine on the GPU: the weighted sum of each token's expert rows, in slot order (moe.cuh).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/bf16_vec.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/moe.cuh"
#include "afd/kernels/cuda/moe_forms.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

// out[t] (+)= sum_j y[row_of_slot[t, j]] * w[t, j], j in order, then + addend[t] when given (the
// shared experts' output: the same bits as a separate Add after). Block (token, column slice),
// one thread per kVec columns: the k row loads of a thread are independent, so they are in
// flight together (one thread walking the k slots of 8 columns in series took 22 us per layer
// at batch 1, the latency of ~50 dependent loads).
template <int kVec>
__global__ void Combine(const float* y, int64_t h, const int32_t* ros, const float* w, int64_t k,
                        bool accumulate, const float* addend, float* out) {
  PdlStart();
  using V = std::conditional_t<kVec == 4, float4, float>;
  const int64_t t = blockIdx.x;
  const int64_t i = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  if (i >= h) return;
  float o[kVec];
  if (accumulate) {
    const V v = *reinterpret_cast<const V*>(out + t * h + i);
    memcpy(o, &v, sizeof(V));
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[e] = 0.0f;
  }
#pragma unroll 8
  for (int64_t j = 0; j < k; ++j) {
    const int32_t r = ros[t * k + j];
    if (r < 0) continue;
    const float wj = w[t * k + j];
    const V v = *reinterpret_cast<const V*>(y + int64_t(r) * h + i);
    float yv[kVec];
    memcpy(yv, &v, sizeof(V));
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[e] += yv[e] * wj;
  }
  if (addend != nullptr) {
    const V a = *reinterpret_cast<const V*>(addend + t * h + i);
    float av[kVec];
    memcpy(av, &a, sizeof(V));
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[e] += av[e];
  }
  V v;
  memcpy(&v, o, sizeof(V));
  *reinterpret_cast<V*>(out + t * h + i) = v;
}

}  // namespace

void LaunchMoeCombine(const float* y, int64_t h, const int32_t* row_of_slot, const float* weights,
                      int64_t n, int64_t k, bool accumulate, const float* addend, float* out,
                      cudaStream_t s) {
  if (n == 0 || h == 0) return;
  constexpr int kThreadsPerBlock = 128;
  const auto launch = [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    const int64_t per_block = int64_t{kThreadsPerBlock} * kVec;
    const dim3 grid(static_cast<unsigned>(n),
                    static_cast<unsigned>((h + per_block - 1) / per_block));
    LaunchPdl(Combine<kVec>, grid, kThreadsPerBlock, 0, s, y, h, row_of_slot, weights, k,
              accumulate, addend, out);
  };
  const bool vec4 = h % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(addend) % 16 == 0;
  if (vec4) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  CheckLaunch("MoeCombine");
}

}  // namespace afd::kernels::cuda

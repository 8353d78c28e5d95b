// RoPE and the MLA cache write: each token's latent row (kv_a_layernorm'd) and its rotated
// rope key into its cache slot (mla.cuh).
#include <cuda.h>  // CUtensorMap (encoded through the runtime's driver entry point)
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/elementwise.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/mla_decode.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/pdl.cuh"
#include "afd/kernels/cuda/rope.cuh"

namespace afd::kernels::cuda {

namespace {

__global__ void Rope(float* x, int64_t heads, int64_t width, int64_t offset, const int64_t* pos,
                     RopeArgs r) {
  PdlStart();
  const int64_t t = blockIdx.x, half = r.dim / 2;
  for (int64_t e = threadIdx.x; e < heads * half; e += blockDim.x) {
    RotatePair(x + (t * heads + e / half) * width + offset, r, pos[t], e % half);
  }
}

constexpr int kMaxRopeDim = 512;  // CacheWrite stages the rope key in shared memory

// A cache value from fp32: as is, or rounded to bf16 (round to nearest even, as on the CPU).
__device__ __forceinline__ void StoreCache(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreCache(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// One block per token: the normalised latent and the roped key, computed in fp32 (the rope key
// rotated in shared memory), stored as the cache's T.
template <typename T>
__global__ void CacheWrite(const float* ckv, int64_t kvr, const float* norm_w, float eps,
                           PagedArgs t, RopeArgs r, T* cache) {
  PdlStart();
  __shared__ float partial[32];
  __shared__ float pe[kMaxRopeDim];
  const int64_t i = blockIdx.x, width = kvr + r.dim;
  if (t.slot_mapping[i] < 0) return;  // a padding row of a captured graph
  const float* src = ckv + i * width;
  T* row = cache + t.slot_mapping[i] * width;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < kvr; j += blockDim.x) ss += src[j] * src[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += partial[w];
  const float inv = rsqrtf(total / kvr + eps);
  for (int64_t j = threadIdx.x; j < kvr; j += blockDim.x) {
    StoreCache(row + j, norm_w[j] * (src[j] * inv));
  }
  for (int64_t j = threadIdx.x; j < r.dim; j += blockDim.x) pe[j] = src[kvr + j];
  __syncthreads();
  if (threadIdx.x < r.dim / 2) RotatePair(pe, r, t.positions[i], threadIdx.x);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < r.dim; j += blockDim.x) StoreCache(row + kvr + j, pe[j]);
}

}  // namespace

void LaunchRope(float* x, int64_t n, int64_t heads, int64_t width, int64_t offset,
                const int64_t* positions, const RopeArgs& rope, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl(Rope, static_cast<unsigned>(n), 256, 0, s, x, heads, width, offset, positions, rope);
  CheckLaunch("Rope");
}

void LaunchMlaCacheWrite(const float* ckv, int64_t n, int64_t kvr, const float* norm_w, float eps,
                         const PagedArgs& t, const RopeArgs& rope, void* cache, bool bf16_cache,
                         cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(rope.dim <= kMaxRopeDim, "MlaCacheWrite: rope dim {} above {}", rope.dim, kMaxRopeDim);
  if (bf16_cache) {
    LaunchPdl(CacheWrite<__nv_bfloat16>, static_cast<unsigned>(n), 256, 0, s, ckv, kvr, norm_w, eps,
              t, rope, static_cast<__nv_bfloat16*>(cache));
  } else {
    LaunchPdl(CacheWrite<float>, static_cast<unsigned>(n), 256, 0, s, ckv, kvr, norm_w, eps, t,
              rope, static_cast<float*>(cache));
  }
  CheckLaunch("MlaCacheWrite");
}

}  // namespace afd::kernels::cuda

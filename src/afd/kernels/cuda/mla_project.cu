// The W_k / W_v products around absorbed MLA for a few tokens (MlaQLat, MlaOut; mla.cuh).
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

// The W_k / W_v products of absorbed MLA for a few tokens (decode at small batch). cuBLAS's
// batched SGEMMs take tens of microseconds at n = 1 for ~4 MB of weights per layer; these read
// each head's weights once per chunk of kMlaTok tokens, fp32 throughout, every sum in a fixed
// order (no atomics): the same result whatever the batch around a token.
constexpr int kMlaTok = 8;      // tokens per block (chunk)
constexpr int kQLatGroups = 4;  // d-groups per column in MlaQLat (threads = 32 x groups)
constexpr int kMlaLoads = 16;   // MlaQLat's weight loads in flight per thread

// q_lat[t, hh, c] = sum_d q[t, h0 + hh, d] * W_k[h0 + hh][d, c]; W_k[h] = kv_b + h (dn + dv) kvr,
// rows of kvr. Grid (ceil(kvr / 32), nh, ceil(n / kMlaTok)); thread (lane, g) sums d = g, g + 4,
// ... for column 32 blockIdx.x + lane, then group 0 adds the groups in order.
__global__ void __launch_bounds__(32 * kQLatGroups)
    MlaQLat(const float* q, int64_t n, int64_t heads, int64_t dn, int64_t dr, int64_t dv,
            const float* kv_b, int64_t h0, int64_t nh, int64_t kvr, float* q_lat) {
  extern __shared__ float smem[];  // q_nope [kMlaTok][dn], then partial [groups][kMlaTok][32]
  float* qs = smem;
  float* part = smem + kMlaTok * dn;
  const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int64_t hh = blockIdx.y, h = h0 + hh, t0 = int64_t(blockIdx.z) * kMlaTok;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  const bool active = c < kvr;
  const float* w = kv_b + h * (dn + dv) * kvr + (active ? c : 0);
  // kMlaLoads weights in flight per thread (d = g, g + groups, ...), the first batch before the
  // wait for the kernel before (nothing writes the weights).
  float wv[kMlaLoads];
  const auto load = [&](int64_t d0) {
#pragma unroll
    for (int u = 0; u < kMlaLoads; ++u) {
      const int64_t d = d0 + u * kQLatGroups;
      wv[u] = active && d < dn ? w[d * kvr] : 0.0f;
    }
  };
  load(g);
  PdlStart();
  const int cnt = static_cast<int>(n - t0 < kMlaTok ? n - t0 : kMlaTok);
  for (int64_t i = threadIdx.x; i < cnt * dn; i += blockDim.x) {
    const int64_t t = i / dn, d = i % dn;
    qs[i] = q[((t0 + t) * heads + h) * (dn + dr) + d];
  }
  __syncthreads();
  float acc[kMlaTok] = {};
  for (int64_t d0 = g;;) {
#pragma unroll
    for (int u = 0; u < kMlaLoads; ++u) {
      const int64_t d = d0 + u * kQLatGroups;
      if (d >= dn) break;
#pragma unroll
      for (int t = 0; t < kMlaTok; ++t) acc[t] += qs[t * dn + d] * wv[u];
    }
    d0 += kMlaLoads * kQLatGroups;
    if (d0 >= dn) break;
    load(d0);
  }
#pragma unroll
  for (int t = 0; t < kMlaTok; ++t) part[(g * kMlaTok + t) * 32 + lane] = acc[t];
  __syncthreads();
  if (g != 0 || !active) return;
  for (int t = 0; t < cnt; ++t) {
    float v = part[t * 32 + lane];
    for (int gg = 1; gg < kQLatGroups; ++gg) v += part[(gg * kMlaTok + t) * 32 + lane];
    q_lat[((t0 + t) * nh + hh) * kvr + c] = v;
  }
}

// out[t, hh dv + j] = sum_c o_lat[t, hh, c] * W_v[h0 + hh][j, c]; W_v[h] = W_k[h] + dn kvr, rows
// of kvr. Grid (ceil(dv / 8), nh, ceil(n / kMlaTok)), 8 warps: warp w computes output j = 8
// blockIdx.x + w, its lanes striding over c with 16-byte loads, then a fixed shuffle tree.
__global__ void __launch_bounds__(256)
    MlaOut(const float* o_lat, int64_t n, int64_t dn, int64_t dv, const float* kv_b, int64_t h0,
           int64_t nh, int64_t kvr, float* out) {
  extern __shared__ float smem[];  // o_lat of this head [kMlaTok][kvr]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t hh = blockIdx.y, h = h0 + hh, t0 = int64_t(blockIdx.z) * kMlaTok;
  const int64_t j = int64_t(blockIdx.x) * 8 + warp;
  const bool active = j < dv;
  const float* w = kv_b + (h * (dn + dv) + dn + (active ? j : 0)) * kvr;
  // The row's first kOutLoads 16-byte pieces per lane in flight before the wait (all of a
  // 512-wide row).
  constexpr int kOutLoads = 4;
  float4 wv[kOutLoads];
  const auto load = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kOutLoads; ++u) {
      const int64_t c = c0 + u * 32 * 4;
      if (active && c < kvr) wv[u] = *reinterpret_cast<const float4*>(w + c);
    }
  };
  load(int64_t(lane) * 4);
  PdlStart();
  const int cnt = static_cast<int>(n - t0 < kMlaTok ? n - t0 : kMlaTok);
  for (int64_t i = threadIdx.x; i < cnt * kvr; i += blockDim.x) {
    const int64_t t = i / kvr, c = i % kvr;
    smem[i] = o_lat[((t0 + t) * nh + hh) * kvr + c];
  }
  __syncthreads();
  if (!active) return;
  float acc[kMlaTok] = {};
  for (int64_t c0 = int64_t(lane) * 4;;) {
#pragma unroll
    for (int u = 0; u < kOutLoads; ++u) {
      const int64_t c = c0 + u * 32 * 4;
      if (c >= kvr) break;
#pragma unroll
      for (int t = 0; t < kMlaTok; ++t) {
        if (t >= cnt) break;
        const float4 ov = *reinterpret_cast<const float4*>(smem + t * kvr + c);
        acc[t] += wv[u].x * ov.x + wv[u].y * ov.y + wv[u].z * ov.z + wv[u].w * ov.w;
      }
    }
    c0 += kOutLoads * 32 * 4;
    if (c0 >= kvr) break;
    load(c0);
  }
#pragma unroll
  for (int t = 0; t < kMlaTok; ++t) {
    if (t >= cnt) break;
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[(t0 + t) * nh * dv + hh * dv + j] = v;
  }
}

}  // namespace

bool MlaProjectionsFit(int64_t n, int64_t dn, int64_t kvr) {
  return n >= 1 && n <= kMlaSmallBatch && kvr % 4 == 0 &&
         (kMlaTok * dn + kQLatGroups * kMlaTok * 32) * sizeof(float) <= 48 * 1024 &&
         kMlaTok * kvr * sizeof(float) <= 48 * 1024;
}

void LaunchMlaQLat(const float* q, int64_t n, int64_t heads, int64_t dn, int64_t dr, int64_t dv,
                   const float* kv_b, int64_t h0, int64_t h1, int64_t kvr, float* q_lat,
                   cudaStream_t s) {
  AFD_CHECK(MlaProjectionsFit(n, dn, kvr), "MlaQLat: {} tokens, dn {}, kvr {}", n, dn, kvr);
  const int64_t nh = h1 - h0;
  const dim3 grid(static_cast<unsigned>((kvr + 31) / 32), static_cast<unsigned>(nh),
                  static_cast<unsigned>((n + kMlaTok - 1) / kMlaTok));
  const size_t smem = (kMlaTok * dn + kQLatGroups * kMlaTok * 32) * sizeof(float);
  LaunchPdl(MlaQLat, grid, 32 * kQLatGroups, smem, s, q, n, heads, dn, dr, dv, kv_b, h0, nh, kvr,
            q_lat);
  CheckLaunch("MlaAttention (W_k)");
}

void LaunchMlaOut(const float* o_lat, int64_t n, int64_t dn, int64_t dv, const float* kv_b,
                  int64_t h0, int64_t h1, int64_t kvr, float* out, cudaStream_t s) {
  AFD_CHECK(MlaProjectionsFit(n, dn, kvr), "MlaOut: {} tokens, dn {}, kvr {}", n, dn, kvr);
  const int64_t nh = h1 - h0;
  const dim3 grid(static_cast<unsigned>((dv + 7) / 8), static_cast<unsigned>(nh),
                  static_cast<unsigned>((n + kMlaTok - 1) / kMlaTok));
  LaunchPdl(MlaOut, grid, 256, kMlaTok * kvr * sizeof(float), s, o_lat, n, dn, dv, kv_b, h0, nh,
            kvr, out);
  CheckLaunch("MlaAttention (W_v)");
}

}  // namespace afd::kernels::cuda

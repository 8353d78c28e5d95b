// RoPE, MLA cache write and absorbed MLA attention over the paged latent cache (the readable
// first CUDA version: one block per (token, head), online softmax over chunks of positions).
#include <algorithm>
#include <cfloat>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/launch.cuh"

namespace afd::kernels::cuda {

namespace {

// cos/sin of the pair i at position pos, computed like the CPU reference (fp32 angle, double
// trig, fp32 result times the attention factor).
__device__ void RopeCosSin(const RopeArgs& r, int64_t pos, int64_t i, float* c, float* s) {
  const float angle = static_cast<float>(pos) * r.inv_freq[i];
  *c = static_cast<float>(cos(static_cast<double>(angle))) * r.factor;
  *s = static_cast<float>(sin(static_cast<double>(angle))) * r.factor;
}

__device__ void RotatePair(float* v, const RopeArgs& r, int64_t pos, int64_t i) {
  const int64_t half = r.dim / 2;
  float c, s;
  RopeCosSin(r, pos, i, &c, &s);
  float* a = r.interleave ? &v[2 * i] : &v[i];
  float* b = r.interleave ? &v[2 * i + 1] : &v[i + half];
  const float x1 = *a, x2 = *b;
  *a = x1 * c - x2 * s;
  *b = x2 * c + x1 * s;
}

__global__ void Rope(float* x, int64_t heads, int64_t width, int64_t offset, const int64_t* pos,
                     RopeArgs r) {
  const int64_t t = blockIdx.x, half = r.dim / 2;
  for (int64_t e = threadIdx.x; e < heads * half; e += blockDim.x) {
    RotatePair(x + (t * heads + e / half) * width + offset, r, pos[t], e % half);
  }
}

__global__ void CacheWrite(const float* ckv, int64_t kvr, const float* norm_w, float eps,
                           PagedArgs t, RopeArgs r, float* cache) {
  __shared__ float partial[32];
  const int64_t i = blockIdx.x, width = kvr + r.dim;
  if (t.slot_mapping[i] < 0) return;  // a padding row of a captured graph
  const float* src = ckv + i * width;
  float* row = cache + t.slot_mapping[i] * width;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < kvr; j += blockDim.x) ss += src[j] * src[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += partial[w];
  const float inv = rsqrtf(total / kvr + eps);
  for (int64_t j = threadIdx.x; j < kvr; j += blockDim.x) row[j] = norm_w[j] * (src[j] * inv);
  for (int64_t j = threadIdx.x; j < r.dim; j += blockDim.x) row[kvr + j] = src[kvr + j];
  __syncthreads();
  if (threadIdx.x < r.dim / 2) RotatePair(row + kvr, r, t.positions[i], threadIdx.x);
}

constexpr int kAttnThreads = 256;
constexpr int kChunk = 128;  // positions scored per round

// Block (token, head, split) attends positions [split·span, min((split+1)·span, len)) and
// writes its partial result: partial[((t·nh + h)·splits + split)] = [m | l | o_lat[kvr]]
// (running max, sum of exp(score - m), Σ exp(score - m)·c_j). An empty range writes m = -inf.
// Shared memory: q_lat[kvr] | q_pe[dr] | o_lat[kvr] | p[kChunk].
__global__ void AttentionPartial(const float* q, int64_t heads, const float* kv_b, int64_t kvr,
                                 int64_t dn, int64_t dr, int64_t dv, PagedArgs t,
                                 const float* cache, int64_t h0, int64_t nh, float scale,
                                 int64_t span, float* partial) {
  extern __shared__ float smem[];
  float* q_lat = smem;
  float* q_pe = q_lat + kvr;
  float* o_lat = q_pe + dr;
  float* p = o_lat + kvr;
  const int64_t tok = blockIdx.x, h = h0 + blockIdx.y, width = kvr + dr, splits = gridDim.z;
  const int64_t len = t.positions[tok] + 1, seq = t.seq_index[tok];
  const int64_t j_begin = int64_t(blockIdx.z) * span, j_end = min(len, j_begin + span);
  float* part = partial + ((tok * nh + blockIdx.y) * splits + blockIdx.z) * (kvr + 2);
  if (j_begin >= j_end) {
    if (threadIdx.x == 0) {
      part[0] = -FLT_MAX;
      part[1] = 0.0f;
    }
    for (int64_t l = threadIdx.x; l < kvr; l += blockDim.x) part[2 + l] = 0.0f;
    return;
  }
  const float* qh = q + (tok * heads + h) * (dn + dr);
  const float* w_k = kv_b + h * (dn + dv) * kvr;  // [dn, kvr]
  for (int64_t l = threadIdx.x; l < kvr; l += blockDim.x) {
    float acc = 0.0f;
    for (int64_t d = 0; d < dn; ++d) acc += qh[d] * w_k[d * kvr + l];
    q_lat[l] = acc;
    o_lat[l] = 0.0f;
  }
  for (int64_t d = threadIdx.x; d < dr; d += blockDim.x) q_pe[d] = qh[dn + d];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float m = -FLT_MAX, lsum = 0.0f;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kChunk) {
    const int64_t cnt = min(static_cast<int64_t>(kChunk), j_end - j0);
    for (int64_t jj = warp; jj < cnt; jj += warps) {  // scores: one warp per position
      const int64_t j = j0 + jj;
      const int64_t slot =
          int64_t(t.block_tables[seq * t.max_blocks + j / t.block_size]) * t.block_size +
          j % t.block_size;
      const float* row = cache + slot * width;
      float acc = 0.0f;
      for (int64_t l = lane; l < kvr; l += 32) acc += q_lat[l] * row[l];
      for (int64_t d = lane; d < dr; d += 32) acc += q_pe[d] * row[kvr + d];
      for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (lane == 0) p[jj] = acc * scale;
    }
    __syncthreads();
    float cmax = -FLT_MAX;
    for (int64_t jj = 0; jj < cnt; ++jj) cmax = fmaxf(cmax, p[jj]);
    const float m_new = fmaxf(m, cmax), rescale = expf(m - m_new);
    __syncthreads();
    if (threadIdx.x < cnt) p[threadIdx.x] = expf(p[threadIdx.x] - m_new);
    __syncthreads();
    float csum = 0.0f;
    for (int64_t jj = 0; jj < cnt; ++jj) csum += p[jj];
    lsum = lsum * rescale + csum;
    m = m_new;
    for (int64_t l = threadIdx.x; l < kvr; l += blockDim.x) {
      float acc = o_lat[l] * rescale;
      for (int64_t jj = 0; jj < cnt; ++jj) {
        const int64_t j = j0 + jj;
        const int64_t slot =
            int64_t(t.block_tables[seq * t.max_blocks + j / t.block_size]) * t.block_size +
            j % t.block_size;
        acc += p[jj] * cache[slot * width + l];
      }
      o_lat[l] = acc;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    part[0] = m;
    part[1] = lsum;
  }
  for (int64_t l = threadIdx.x; l < kvr; l += blockDim.x) part[2 + l] = o_lat[l];
}

// Block (token, head): merges the splits' partials and applies W_v:
// out_h[e] = W_v[e] · (Σ_s e^{m_s - M} o_s) / (Σ_s e^{m_s - M} l_s). Shared: o_lat[kvr].
__global__ void AttentionCombine(const float* kv_b, int64_t kvr, int64_t dn, int64_t dv, int64_t h0,
                                 int64_t nh, int64_t splits, const float* partial, float* out) {
  extern __shared__ float o_lat[];
  const int64_t tok = blockIdx.x, h = h0 + blockIdx.y;
  const float* part = partial + (tok * nh + blockIdx.y) * splits * (kvr + 2);
  float mx = -FLT_MAX;
  for (int64_t s = 0; s < splits; ++s) mx = fmaxf(mx, part[s * (kvr + 2)]);
  float total = 0.0f;
  for (int64_t s = 0; s < splits; ++s) {
    total += part[s * (kvr + 2) + 1] * expf(part[s * (kvr + 2)] - mx);
  }
  for (int64_t l = threadIdx.x; l < kvr; l += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      acc += part[s * (kvr + 2) + 2 + l] * expf(part[s * (kvr + 2)] - mx);
    }
    o_lat[l] = acc;
  }
  __syncthreads();
  const float* w_v = kv_b + h * (dn + dv) * kvr + dn * kvr;  // [dv, kvr]
  float* out_h = out + (tok * nh + blockIdx.y) * dv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t e = warp; e < dv; e += warps) {
    float acc = 0.0f;
    for (int64_t l = lane; l < kvr; l += 32) acc += w_v[e * kvr + l] * o_lat[l];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out_h[e] = acc / total;
  }
}

}  // namespace

void LaunchRope(float* x, int64_t n, int64_t heads, int64_t width, int64_t offset,
                const int64_t* positions, const RopeArgs& rope, cudaStream_t s) {
  if (n == 0) return;
  Rope<<<static_cast<unsigned>(n), 256, 0, s>>>(x, heads, width, offset, positions, rope);
  CheckLaunch("Rope");
}

void LaunchMlaCacheWrite(const float* ckv, int64_t n, int64_t kvr, const float* norm_w, float eps,
                         const PagedArgs& t, const RopeArgs& rope, float* cache, cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(rope.dim / 2 <= 256, "MlaCacheWrite: rope dim {} above 512", rope.dim);
  CacheWrite<<<static_cast<unsigned>(n), 256, 0, s>>>(ckv, kvr, norm_w, eps, t, rope, cache);
  CheckLaunch("MlaCacheWrite");
}

int64_t MlaSplits(int64_t n, int64_t nh, int64_t max_context) {
  // Enough blocks to fill the GPU (~2 per SM on an H200) when few tokens attend long contexts;
  // each split keeps at least two chunks of positions.
  const int64_t blocks = std::max<int64_t>(n * nh, 1);
  const int64_t want = (264 + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, max_context / (2 * kChunk));
  return std::max<int64_t>(1, std::min<int64_t>({want, most, 64}));
}

int64_t MlaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t kvr) {
  return n * nh * splits * (kvr + 2);
}

void LaunchMlaAttention(const float* q, int64_t n, int64_t heads, const float* kv_b, int64_t kvr,
                        int64_t dn, int64_t dr, int64_t dv, const PagedArgs& t, const float* cache,
                        int64_t h0, int64_t h1, float scale, int64_t max_context, int64_t splits,
                        float* partial, float* out, cudaStream_t s) {
  if (n == 0) return;
  const size_t smem = (2 * kvr + dr + kChunk) * sizeof(float);
  AFD_CHECK(smem <= 48 * 1024, "MlaAttention: kv_lora_rank {} needs {} bytes of shared memory", kvr,
            smem);
  const int64_t nh = h1 - h0;
  const int64_t span = (max_context + splits - 1) / splits;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(nh),
                  static_cast<unsigned>(splits));
  AttentionPartial<<<grid, kAttnThreads, smem, s>>>(q, heads, kv_b, kvr, dn, dr, dv, t, cache, h0,
                                                    nh, scale, span, partial);
  CheckLaunch("MlaAttention (partial)");
  const dim3 grid2(static_cast<unsigned>(n), static_cast<unsigned>(nh));
  AttentionCombine<<<grid2, kAttnThreads, kvr * sizeof(float), s>>>(kv_b, kvr, dn, dv, h0, nh,
                                                                    splits, partial, out);
  CheckLaunch("MlaAttention (combine)");
}

}  // namespace afd::kernels::cuda

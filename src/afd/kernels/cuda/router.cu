// Router top-k on the GPU: one warp per token, the CPU reference's rules (softmax or sigmoid
// scores, group masking by max or top-2 sum, top-k with ties to the lower id, NaN ranked below
// every number, ids returned ascending).
#include <cfloat>
#include <climits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/gemv_f32.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/pdl.cuh"
#include "afd/kernels/cuda/router.cuh"

namespace afd::kernels::cuda {

namespace {

__device__ float Key(float v) { return isnan(v) ? -INFINITY : v; }

// One warp per token; the token's scores live in the warp's shared memory (lanes stride over
// experts), so nothing spills to local memory.
constexpr int kRouterWarps = 4;
constexpr int kMaxGroups = 64, kMaxTopk = 32;

struct WarpScratch {
  float score[kMaxRouterExperts];
  float choice[kMaxRouterExperts];
  float gscore[kMaxGroups];
  int32_t picked[kMaxTopk];
  unsigned char taken[kMaxRouterExperts];
  unsigned char gtaken[kMaxGroups];
};

// Index of the largest v[i] among those not taken (ties: lower index; NaN ranks as -inf), the
// same in every lane of the warp.
__device__ int WarpArgMaxFree(const float* v, const unsigned char* taken, int n, int lane) {
  float bk = -INFINITY;
  int bi = INT_MAX;
  for (int i = lane; i < n; i += 32) {  // ascending within a lane: keeps the first maximum
    if (taken[i]) continue;
    const float k = Key(v[i]);
    if (bi == INT_MAX || k > bk) {
      bk = k;
      bi = i;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ok = __shfl_xor_sync(0xffffffffu, bk, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi != INT_MAX && (bi == INT_MAX || ok > bk || (ok == bk && oi < bi))) {
      bk = ok;
      bi = oi;
    }
  }
  return bi;
}

// Token t's route from its logits lt[e] (read through L2: another block may have written
// them), by one warp with its scratch.
__device__ void RouteToken(const float* lt, int e, const float* bias, const RouterArgs& a,
                           WarpScratch& sc, int lane, int64_t t, int32_t* ids, float* weights) {
  if (!a.sigmoid) {
    float mx = NAN;  // fmaxf skips NaN: the largest number (NaN only if every logit is)
    for (int i = lane; i < e; i += 32) mx = fmaxf(mx, __ldcg(lt + i));
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
    for (int i = lane; i < e; i += 32) {
      sc.score[i] = expf(__ldcg(lt + i) - mx);
      sum += sc.score[i];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = static_cast<float>(1.0 / sum);
    for (int i = lane; i < e; i += 32) sc.choice[i] = sc.score[i] = sc.score[i] * inv;
  } else {
    for (int i = lane; i < e; i += 32) {
      sc.score[i] = 1.0f / (1.0f + expf(-__ldcg(lt + i)));
      sc.choice[i] = sc.score[i] + (bias ? bias[i] : 0.0f);
    }
  }
  for (int i = lane; i < e; i += 32) sc.taken[i] = 0;
  __syncwarp();
  if (a.sigmoid || a.group_limited) {
    const int groups = static_cast<int>(a.n_group), gsize = e / groups;
    for (int g = lane; g < groups; g += 32) {
      const float* s = sc.choice + g * gsize;
      if (a.sigmoid && gsize >= 2) {
        float best = -INFINITY, second = -INFINITY;
        for (int i = 0; i < gsize; ++i) {
          if (s[i] > best) {
            second = best;
            best = s[i];
          } else if (s[i] > second) {
            second = s[i];
          }
        }
        sc.gscore[g] = best + second;
      } else if (a.sigmoid) {
        sc.gscore[g] = s[0];
      } else {
        float best = s[0];
        for (int i = 1; i < gsize; ++i) best = fmaxf(best, s[i]);
        sc.gscore[g] = best;
      }
      sc.gtaken[g] = 0;
    }
    __syncwarp();
    for (int r = 0; r < a.topk_group; ++r) {
      const int g = WarpArgMaxFree(sc.gscore, sc.gtaken, groups, lane);
      if (lane == 0) sc.gtaken[g] = 1;
      __syncwarp();
    }
    for (int i = lane; i < e; i += 32) {
      if (!sc.gtaken[i / gsize]) sc.choice[i] = a.sigmoid ? -INFINITY : 0.0f;
    }
    __syncwarp();
  }
  for (int j = 0; j < a.top_k; ++j) {
    const int p = WarpArgMaxFree(sc.choice, sc.taken, e, lane);
    if (lane == 0) {
      sc.picked[j] = p;
      sc.taken[p] = 1;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  int32_t* picked = sc.picked;
  for (int i = 1; i < a.top_k; ++i) {  // ascending ids
    for (int j = i; j > 0 && picked[j - 1] > picked[j]; --j) {
      const int tmp = picked[j];
      picked[j] = picked[j - 1];
      picked[j - 1] = tmp;
    }
  }
  float* wt = weights + t * a.top_k;
  for (int j = 0; j < a.top_k; ++j) {
    ids[t * a.top_k + j] = picked[j];
    wt[j] = sc.score[picked[j]];
  }
  if (a.norm_topk_prob) {
    float sum = 0.0f;
    for (int j = 0; j < a.top_k; ++j) sum += wt[j];
    for (int j = 0; j < a.top_k; ++j) wt[j] /= (sum + a.norm_eps);
  }
  for (int j = 0; j < a.top_k; ++j) wt[j] *= a.scaling;
}

__global__ void __launch_bounds__(kRouterWarps * 32)
    Router(const float* logits, int64_t n, int64_t e64, const float* bias, RouterArgs a,
           int32_t* ids, float* weights) {
  PdlStart();
  __shared__ WarpScratch scratch[kRouterWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t(blockIdx.x) * kRouterWarps + warp;
  if (t >= n) return;  // the whole warp
  RouteToken(logits + t * e64, static_cast<int>(e64), bias, a, scratch[warp], lane, t, ids,
             weights);
}

// The router gate (fp32 x · wᵀ for n <= kGateTokens tokens) and the top-k in one launch: the
// logits by GemvF32Block (the same bits as LaunchGemvF32); the last block to finish (an arrival
// counter that it re-arms) routes every token, warp t token t, and, given a PermuteArgs with
// offsets, warp 0 then groups the slots as MoePermute does (WarpPermute).
constexpr int kGateTokens = kGemvF32Warps;

// MoePermute of n·k <= kWarpPermuteSlots slots over <= kWarpPermuteExperts local experts by one
// warp: slot s (expert e_s, local when begin <= id < begin + local) goes to grouped row
// #{s' : local, (e_s', s') < (e_s, s)} — by expert, then slot order, as Permute places them;
// offsets[x] = #{local slots with e < x}. Lane l holds slots l and l + 32; every count is a
// loop over all slots (shuffled from their lanes). ids are read plainly: this block's warps
// wrote them before the barrier that precedes the call.
constexpr int kWarpPermuteSlots = 64, kWarpPermuteExperts = 256;

__device__ void WarpPermute(const int32_t* ids, int slots, int k, const PermuteArgs& p, int lane) {
  int e[2];
  bool mine[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int s = lane + 32 * i;
    e[i] = s < slots ? ids[s] - static_cast<int>(p.begin) : -1;
    mine[i] = s < slots && e[i] >= 0 && e[i] < p.local;
  }
  // Before (e, s): a lane's two slots, then the experts x it owns (lane, lane + 32, ... <= local).
  int before[2] = {0, 0};
  constexpr int kOwned = kWarpPermuteExperts / 32 + 1;
  int below[kOwned] = {};
  for (int s2 = 0; s2 < slots; ++s2) {
    const int e2 = __shfl_sync(0xffffffffu, s2 < 32 ? e[0] : e[1], s2 & 31);
    const bool m2 = __shfl_sync(0xffffffffu, s2 < 32 ? mine[0] : mine[1], s2 & 31);
    if (!m2) continue;  // the same in every lane
#pragma unroll
    for (int i = 0; i < 2; ++i) before[i] += e2 < e[i] || (e2 == e[i] && s2 < lane + 32 * i);
#pragma unroll
    for (int j = 0; j < kOwned; ++j) below[j] += e2 < lane + 32 * j;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (lane + 32 * i < slots) p.src_row[lane + 32 * i] = 0;
  }
#pragma unroll
  for (int j = 0; j < kOwned; ++j) {
    if (lane + 32 * j <= p.local) p.offsets[lane + 32 * j] = below[j];
  }
  __syncwarp();  // the zeros before the placements (another lane may place where one went)
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int s = lane + 32 * i;
    if (s >= slots) continue;
    p.row_of_slot[s] = mine[i] ? before[i] : -1;
    if (mine[i]) p.src_row[before[i]] = s / k;
  }
}

template <int kRowsMax>
__global__ void __launch_bounds__(kGemvF32Warps * 32)
    RouterGateTopk(const float* x, int rows, int64_t k, const float* w, int64_t e64, int splits,
                   float* logits, const float* bias, RouterArgs a, int32_t* ids, float* weights,
                   PermuteArgs p, unsigned int* counter) {
  __shared__ WarpScratch scratch[kGemvF32Warps];
  __shared__ float part[kGemvF32Warps][kRowsMax];
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  GemvF32Block<kRowsMax, false>(x, rows, k, w, e64, splits, nullptr, part, logits);
  __threadfence();  // this block's logits visible before its arrival counts
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp < rows) {
    RouteToken(logits + warp * e64, static_cast<int>(e64), bias, a, scratch[warp], lane, warp, ids,
               weights);
  }
  if (threadIdx.x == 0) *counter = 0;  // re-armed for the next launch (graph replays too)
  if (p.offsets == nullptr) return;
  __syncthreads();  // every token's ids written
  if (warp == 0)
    WarpPermute(ids, rows * static_cast<int>(a.top_k), static_cast<int>(a.top_k), p, lane);
}

// RouterRows, for 65-511 tokens (launch.cuh says why not fewer): block (x, y) sums the logits of
// tokens 8x .. 8x + 7 against experts 8y .. 8y + 7, its warps splitting K (lane l of warp w takes
// the float4 chunks 32w + l, + 256, ...; fp32 FMA in k order), a butterfly adding each warp's
// lanes, then the warps' sums added in warp order: one order per logit, the same in every block and
// batch. The last block of a token group to finish (an arrival counter it re-arms) routes the
// group's tokens, warp t token t (RouteToken, the Router kernel's rules). Replaces cuBLAS's
// SGEMM (~27 us for 64-256 x 2048 -> 64 in the decode graph: a SIMT kernel on a few blocks), its
// split-K reduce and the Router launch on the MoE block's critical path (kernel trace, twentieth
// session).
constexpr int kRowsTokens = 8, kRowsWarps = 8, kRowsExperts = 8;
constexpr int kRowsSums = kRowsTokens * kRowsExperts;

__global__ void __launch_bounds__(kRowsWarps * 32)
    RouterRows(const float* x, int64_t n, int64_t k, const float* w, int64_t e64, float* logits,
               const float* bias, RouterArgs a, int32_t* ids, float* weights,
               unsigned int* counters) {
  __shared__ float part[kRowsWarps][kRowsSums];
  __shared__ WarpScratch scratch[kRowsTokens];
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t0 = int64_t(blockIdx.x) * kRowsTokens, e0 = int64_t(blockIdx.y) * kRowsExperts;
  const int tokens = static_cast<int>(min(static_cast<int64_t>(kRowsTokens), n - t0));
  const int64_t k4 = k / 4;
  const float4* wr[kRowsExperts];  // experts past e64 read the last one; never written
#pragma unroll
  for (int j = 0; j < kRowsExperts; ++j) {
    wr[j] = reinterpret_cast<const float4*>(w + min(e0 + j, e64 - 1) * k);
  }
  const int64_t i0 = warp * 32 + lane;
  float4 w0[kRowsExperts];  // the first chunk's weights in flight before the programmatic wait
#pragma unroll
  for (int j = 0; j < kRowsExperts; ++j) {
    w0[j] = i0 < k4 ? __ldg(wr[j] + i0) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  PdlStart();
  const float4* xr[kRowsTokens];  // likewise rows past n
#pragma unroll
  for (int t = 0; t < kRowsTokens; ++t) {
    xr[t] = reinterpret_cast<const float4*>(x + (t0 + min(t, tokens - 1)) * k);
  }
  float acc[kRowsTokens][kRowsExperts] = {};
  for (int64_t i = i0; i < k4; i += kRowsWarps * 32) {
    float4 xv[kRowsTokens];
#pragma unroll
    for (int t = 0; t < kRowsTokens; ++t) xv[t] = __ldg(xr[t] + i);
#pragma unroll
    for (int j = 0; j < kRowsExperts; ++j) {
      const float4 wv = i == i0 ? w0[j] : __ldg(wr[j] + i);
#pragma unroll
      for (int t = 0; t < kRowsTokens; ++t) {
        float v = acc[t][j];
        v = fmaf(xv[t].x, wv.x, v);
        v = fmaf(xv[t].y, wv.y, v);
        v = fmaf(xv[t].z, wv.z, v);
        acc[t][j] = fmaf(xv[t].w, wv.w, v);
      }
    }
  }
#pragma unroll
  for (int v = 0; v < kRowsSums; ++v) {
    float& s = acc[v / kRowsExperts][v % kRowsExperts];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == v % 32) part[warp][v] = s;
  }
  __syncthreads();
  if (threadIdx.x < kRowsSums) {
    const int t = threadIdx.x / kRowsExperts, j = threadIdx.x % kRowsExperts;
    float s = part[0][threadIdx.x];
#pragma unroll
    for (int q = 1; q < kRowsWarps; ++q) s += part[q][threadIdx.x];
    if (t < tokens && e0 + j < e64) logits[(t0 + t) * e64 + e0 + j] = s;
  }
  __threadfence();  // this block's logits visible before its arrival counts
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp < tokens) {
    RouteToken(logits + (t0 + warp) * e64, static_cast<int>(e64), bias, a, scratch[warp], lane,
               t0 + warp, ids, weights);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // re-armed (graph replays too)
}

static_assert(kRowsTokens <= kRowsWarps, "a warp per token to route");
static_assert(kRowsSums <= kRowsWarps * 32, "a thread per logit of the block");

}  // namespace

bool RouterRowsFits(int64_t n, int64_t k, int64_t num_experts, const RouterArgs& args) {
  return n >= kMinRouterRowsTokens && n <= kMaxRouterRowsTokens && k % 4 == 0 &&
         num_experts <= kMaxRouterExperts && args.n_group <= kMaxGroups && args.top_k <= kMaxTopk;
}

int64_t RouterRowsCounters(int64_t n) { return (n + kRowsTokens - 1) / kRowsTokens; }

void LaunchRouterRows(const float* x, int64_t n, int64_t k, const float* w, int64_t num_experts,
                      float* logits, const float* bias, const RouterArgs& args, int32_t* ids,
                      float* weights, unsigned int* counters, cudaStream_t s) {
  AFD_CHECK(RouterRowsFits(n, k, num_experts, args),
            "RouterRows on cuda: {} tokens, K = {}, {} experts", n, k, num_experts);
  const dim3 grid(static_cast<unsigned>(RouterRowsCounters(n)),
                  static_cast<unsigned>((num_experts + kRowsExperts - 1) / kRowsExperts));
  LaunchPdl(RouterRows, grid, kRowsWarps * 32, 0, s, x, n, k, w, num_experts, logits, bias, args,
            ids, weights, counters);
  CheckLaunch("RouterRows");
}

void LaunchRouterTopk(const float* logits, int64_t n, int64_t num_experts, const float* bias,
                      const RouterArgs& args, int32_t* ids, float* weights, cudaStream_t s) {
  AFD_CHECK(
      num_experts <= kMaxRouterExperts && args.n_group <= kMaxGroups && args.top_k <= kMaxTopk,
      "RouterTopk on cuda: {} experts, {} groups, top-{} (at most {}, 64, 32)", num_experts,
      args.n_group, args.top_k, kMaxRouterExperts);
  if (n == 0) return;
  LaunchPdl(Router, static_cast<unsigned>((n + kRouterWarps - 1) / kRouterWarps), kRouterWarps * 32,
            0, s, logits, n, num_experts, bias, args, ids, weights);
  CheckLaunch("RouterTopk");
}

bool RouterGateTopkFits(int64_t n, int64_t k, int64_t num_experts, const RouterArgs& args) {
  return n >= 1 && n <= kGateTokens && k % 4 == 0 && num_experts <= kMaxRouterExperts &&
         args.n_group <= kMaxGroups && args.top_k <= kMaxTopk;
}

bool RouterPermuteFits(int64_t n, const RouterArgs& args, int64_t num_local) {
  return n * args.top_k <= kWarpPermuteSlots && num_local <= kWarpPermuteExperts;
}

void LaunchRouterGateTopk(const float* x, int64_t n, int64_t k, const float* w, int64_t num_experts,
                          float* logits, const float* bias, const RouterArgs& args, int32_t* ids,
                          float* weights, const PermuteArgs& permute, unsigned int* counter,
                          cudaStream_t s) {
  AFD_CHECK(RouterGateTopkFits(n, k, num_experts, args),
            "RouterGateTopk on cuda: {} tokens, K = {}, {} experts", n, k, num_experts);
  AFD_CHECK(permute.offsets == nullptr || RouterPermuteFits(n, args, permute.local),
            "RouterGateTopk on cuda: grouping {} x {} slots over {} experts", n, args.top_k,
            permute.local);
  const int splits = GemvF32Splits(num_experts), cols = kGemvF32Warps / splits;
  const unsigned blocks = static_cast<unsigned>((num_experts + cols - 1) / cols);
  const auto launch = [&](auto kernel) {
    LaunchPdl(kernel, blocks, kGemvF32Warps * 32, 0, s, x, static_cast<int>(n), k, w, num_experts,
              splits, logits, bias, args, ids, weights, permute, counter);
  };
  if (n <= 1) {
    launch(RouterGateTopk<1>);
  } else if (n <= 4) {
    launch(RouterGateTopk<4>);
  } else {
    launch(RouterGateTopk<kGateTokens>);
  }
  CheckLaunch("RouterGateTopk");
}

}  // namespace afd::kernels::cuda

// Router top-k on the GPU: one thread per token, the CPU reference's rules (softmax or sigmoid
// scores, group masking by max or top-2 sum, top-k with ties to the lower id, NaN ranked below
// every number, ids returned ascending).
#include <cfloat>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/launch.cuh"

namespace afd::kernels::cuda {

namespace {

__device__ float Key(float v) { return isnan(v) ? -INFINITY : v; }

// Index of the largest v[i] among those not taken (ties: lower index).
__device__ int ArgMaxFree(const float* v, const bool* taken, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (taken[i]) continue;
    if (best < 0 || Key(v[i]) > Key(v[best])) best = i;
  }
  return best;
}

__global__ void Router(const float* logits, int64_t n, int64_t e, const float* bias, RouterArgs a,
                       int32_t* ids, float* weights) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= n) return;
  float score[kMaxRouterExperts], choice[kMaxRouterExperts];
  bool taken[kMaxRouterExperts];
  const float* lt = logits + t * e;
  if (!a.sigmoid) {
    float mx = lt[0];
    for (int i = 1; i < e; ++i) mx = fmaxf(mx, lt[i]);
    double sum = 0.0;
    for (int i = 0; i < e; ++i) {
      score[i] = expf(lt[i] - mx);
      sum += score[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int i = 0; i < e; ++i) choice[i] = score[i] = score[i] * inv;
  } else {
    for (int i = 0; i < e; ++i) {
      score[i] = 1.0f / (1.0f + expf(-lt[i]));
      choice[i] = score[i] + (bias ? bias[i] : 0.0f);
    }
  }
  if (a.sigmoid || a.group_limited) {
    const int gsize = static_cast<int>(e / a.n_group);
    float gscore[64];
    bool gtaken[64];
    for (int g = 0; g < a.n_group; ++g) {
      const float* s = choice + g * gsize;
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
        gscore[g] = best + second;
      } else if (a.sigmoid) {
        gscore[g] = s[0];
      } else {
        float best = s[0];
        for (int i = 1; i < gsize; ++i) best = fmaxf(best, s[i]);
        gscore[g] = best;
      }
      gtaken[g] = false;
    }
    for (int r = 0; r < a.topk_group; ++r) gtaken[ArgMaxFree(gscore, gtaken, a.n_group)] = true;
    for (int i = 0; i < e; ++i) {
      if (!gtaken[i / gsize]) choice[i] = a.sigmoid ? -INFINITY : 0.0f;
    }
  }
  for (int i = 0; i < e; ++i) taken[i] = false;
  int picked[32];
  for (int j = 0; j < a.top_k; ++j) {
    picked[j] = ArgMaxFree(choice, taken, static_cast<int>(e));
    taken[picked[j]] = true;
  }
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
    wt[j] = score[picked[j]];
  }
  if (a.sigmoid && a.norm_topk_prob) {
    float sum = 0.0f;
    for (int j = 0; j < a.top_k; ++j) sum += wt[j];
    for (int j = 0; j < a.top_k; ++j) wt[j] /= (sum + 1e-20f);
  }
  for (int j = 0; j < a.top_k; ++j) wt[j] *= a.scaling;
}

}  // namespace

void LaunchRouterTopk(const float* logits, int64_t n, int64_t num_experts, const float* bias,
                      const RouterArgs& args, int32_t* ids, float* weights, cudaStream_t s) {
  AFD_CHECK(num_experts <= kMaxRouterExperts && args.n_group <= 64 && args.top_k <= 32,
            "RouterTopk on cuda: {} experts, {} groups, top-{} (at most {}, 64, 32)", num_experts,
            args.n_group, args.top_k, kMaxRouterExperts);
  if (n == 0) return;
  Router<<<static_cast<unsigned>((n + 63) / 64), 64, 0, s>>>(logits, n, num_experts, bias, args,
                                                             ids, weights);
  CheckLaunch("RouterTopk");
}

}  // namespace afd::kernels::cuda

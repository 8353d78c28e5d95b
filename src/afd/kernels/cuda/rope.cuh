// The rotary embedding of one pair of dims on the device, computed like the CPU reference
// (kernels/cpu/mla.h ApplyRope): fp32 angle, double trig, fp32 result times the attention
// factor. Shared by the MLA and GQA cache writes and the Rope op.
#pragma once

#include <cstdint>

#include "afd/kernels/cuda/attention_args.cuh"  // RopeArgs

namespace afd::kernels::cuda {

__device__ __forceinline__ void RopeCosSin(const RopeArgs& r, int64_t pos, int64_t i, float* c,
                                           float* s) {
  const float angle = static_cast<float>(pos) * r.inv_freq[i];
  *c = static_cast<float>(cos(static_cast<double>(angle))) * r.factor;
  *s = static_cast<float>(sin(static_cast<double>(angle))) * r.factor;
}

// Rotates pair i of v (dims 2i, 2i+1 when interleaved, else i, i + dim/2) for position pos.
__device__ __forceinline__ void RotatePair(float* v, const RopeArgs& r, int64_t pos, int64_t i) {
  const int64_t half = r.dim / 2;
  float c, s;
  RopeCosSin(r, pos, i, &c, &s);
  float* a = r.interleave ? &v[2 * i] : &v[i];
  float* b = r.interleave ? &v[2 * i + 1] : &v[i + half];
  const float x1 = *a, x2 = *b;
  *a = x1 * c - x2 * s;
  *b = x2 * c + x1 * s;
}

}  // namespace afd::kernels::cuda

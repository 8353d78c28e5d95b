// Device helpers shared by the bf16 GEMV kernels (gemv.cu, moe.cu).
#pragma once

#include <cuda_bf16.h>

namespace afd::kernels::cuda {

// The 8 bf16 values of one 16-byte load as floats.
__device__ __forceinline__ void Unpack8Bf16(const uint4& v, float* out) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(p[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

}  // namespace afd::kernels::cuda

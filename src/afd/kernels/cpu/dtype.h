// Scalar element types of weights and their conversion to fp32. Activations are always fp32;
// weights may stay bf16 in memory (converted per row / per panel by the GEMM).
#pragma once

#include <cstdint>
#include <cstring>

#include "afd/common/dtype.h"

namespace afd::kernels {

// Element types are afd::DType (common/dtype.h): the weights use kF32, kBF16 and kF16, with
// afd::DTypeSize / afd::DTypeName.
using DType = ::afd::DType;

// bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32 bits.
inline float Bf16ToF32(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// fp32 -> bf16 with round-to-nearest-even (NaN stays NaN).
uint16_t F32ToBf16(float f);
// IEEE half -> fp32, exact (subnormals, inf and NaN included).
float F16ToF32(uint16_t h);

// dst[i] = src[i] converted to fp32, for `count` elements of type `src_type`.
void ConvertToF32(DType src_type, const void* src, int64_t count, float* dst);

}  // namespace afd::kernels

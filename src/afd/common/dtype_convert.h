// Conversions between the element types of weights (afd::DType: kF32, kBF16, kF16) and fp32.
#pragma once

#include <cstdint>
#include <cstring>

#include "afd/common/dtype.h"

namespace afd {

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

// OCP FP8 E4M3 (safetensors "F8_E4M3", torch.float8_e4m3fn) -> fp32, exact: 1 sign, 4
// exponent (bias 7) and 3 mantissa bits, subnormals below 2^-6, no infinities, 0x7f / 0xff NaN.
float Fp8E4M3ToF32(uint8_t v);
// fp32 -> FP8 E4M3, round to nearest even, saturating at +-448 (torch's float8_e4m3fn cast of a
// clamped value); NaN -> 0x7f.
uint8_t F32ToFp8E4M3(float f);

// dst[i] = src[i] (fp32) stored as `dst_type` (kF32, or kBF16 rounded to nearest even).
void ConvertFromF32(const float* src, int64_t count, DType dst_type, void* dst);

// dst[i] = src[i] converted to fp32, for `count` elements of type `src_type`.
void ConvertToF32(DType src_type, const void* src, int64_t count, float* dst);

}  // namespace afd

#include "afd/common/dtype_convert.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "afd/common/error.h"

namespace afd {

uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void ConvertToF32(DType src_type, const void* src, int64_t count, float* dst) {
  switch (src_type) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = Fp8E4M3ToF32(s[i]);
      return;
    }
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      break;
  }
  AFD_THROW("ConvertToF32: {} is not a floating-point weight type", DTypeName(src_type));
}

float Fp8E4M3ToF32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf, man = v & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);  // man / 8 * 2^-6
  return sign * std::ldexp(static_cast<float>(8 + man), exp - 10);      // (1 + man / 8) * 2^(e-7)
}

uint8_t F32ToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::min(std::fabs(f), 448.0f);
  // The E4M3 values are spaced 2^(e-3) in [2^e, 2^(e+1)) for e >= -6, and 2^-9 below 2^-6:
  // scale to that spacing, round half to even (nearbyint under the default rounding mode), and
  // rescale; a carry into the next binade lands on its first value, still exact.
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the binade is [2^(e-1), 2^e)
  const int step = std::max(e - 1, -6) - 3;  // log2 of the spacing
  const float q = std::nearbyint(std::ldexp(a, -step));
  const float v = std::ldexp(q, step);
  if (v == 0.0f) return sign;
  int ve = 0;
  const float vm = std::frexp(v, &ve);  // v = vm * 2^ve
  if (ve - 1 < -6) {                    // subnormal: v = man * 2^-9
    return static_cast<uint8_t>(sign | static_cast<int>(std::ldexp(v, 9)));
  }
  const int mantissa = static_cast<int>((2 * vm - 1) * 8);
  return static_cast<uint8_t>(sign | ((ve - 1 + 7) << 3) | mantissa);
}

void ConvertFromF32(const float* src, int64_t count, DType dst_type, void* dst) {
  if (dst_type == DType::kF32) {
    std::memcpy(dst, src, 4 * static_cast<size_t>(count));
    return;
  }
  AFD_CHECK(dst_type == DType::kBF16, "fp32 values can be stored as fp32 or bf16, not {}",
            DTypeName(dst_type));
  auto* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < count; ++i) out[i] = F32ToBf16(src[i]);
}

}  // namespace afd

// The FP8 rows of the AFD dispatch (connector_extra_config.dispatch_dtype "fp8"): the
// quantization arithmetic shared by the CPU reference, the CUDA kernels and the connector's slot
// layout (the room for the scales).
#pragma once

#include <cstdint>

#include "afd/common/host_device.h"

namespace afd {

// The FP8 dispatch (connector_extra_config.dispatch_dtype "fp8", as DeepEP's): each row in
// OCP E4M3 with one f32 scale per group of kAfdFp8Group consecutive elements (the last group of
// a row partial when the width is not a multiple). For a group of largest magnitude amax:
// q = fp8(x * (448 / a)) (round to nearest even, saturating), scale = a / 448, with
// a = max(amax, 1e-4); the receiver reads x' = fp8_value(q) * scale. Every op is one IEEE f32
// operation, so the CPU reference and the CUDA kernels write the same bytes.
inline constexpr int64_t kAfdFp8Group = 128;
inline constexpr float kAfdFp8Max = 448.0f;
inline constexpr float kAfdFp8MinAmax = 1e-4f;
AFD_HOST_DEVICE inline int64_t AfdFp8Groups(int64_t width) {
  return (width + kAfdFp8Group - 1) / kAfdFp8Group;
}
// The group's clamped amax a: q = fp8(x * AfdFp8Mul(a)), scale = AfdFp8Scale(a).
AFD_HOST_DEVICE inline float AfdFp8Clamp(float amax) {
  return amax > kAfdFp8MinAmax ? amax : kAfdFp8MinAmax;  // NaN -> the clamp (no NaN scale)
}
AFD_HOST_DEVICE inline float AfdFp8Mul(float a) { return kAfdFp8Max / a; }
AFD_HOST_DEVICE inline float AfdFp8Scale(float a) { return a / kAfdFp8Max; }

}  // namespace afd

// Element types that cross process boundaries. Values are part of the wire formats: never
// renumber (docs/wire_formats.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace afd {

enum class DType : uint8_t {
  kF32 = 1,
  kBF16 = 2,
  kF16 = 3,
  kI32 = 4,
  kI64 = 5,
  kU8 = 6,
  // OCP FP8 E4M3 (torch.float8_e4m3fn): the FP8 dispatch's rows, each group of 128 elements of
  // a row with its own f32 scale beside it (kernels/afd_exchange.h).
  kF8E4M3 = 7,
};

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU8:
      return "uint8";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
  }
  return "unknown";
}

// DType of a C++ element type, for the typed Communicator wrappers.
template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kU8;
}

}  // namespace afd

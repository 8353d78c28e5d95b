// A CUDA driver API function by name, through the runtime's entry-point query (the build links
// the static runtime, not libcuda): the one place that asks, for the driver calls the runtime
// does not wrap (stream memory operations, tensor maps, address ranges). For files that include
// the CUDA runtime header themselves.
#pragma once

#include <string>

#include "afd/common/error.h"

namespace afd {

// The driver's `name` (its CUDA 12.0 form), or null with *why saying what is missing.
inline void* CudaDriverFunction(const char* name, std::string* why) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == nullptr) {
    *why = fmt::format("the CUDA driver has no {} ({})", name,
                       e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
    return nullptr;
  }
  return fn;
}

// The same, or throws afd::Error naming `user` (what needs it) and the function.
inline void* RequireCudaDriverFunction(const char* name, const char* user) {
  std::string why;
  void* fn = CudaDriverFunction(name, &why);
  AFD_CHECK(fn != nullptr, "{}: {}", user, why);
  return fn;
}

}  // namespace afd

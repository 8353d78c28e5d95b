// The one check macro for CUDA runtime and cuBLAS calls: a failed call throws afd::Error naming
// the call, the error and the source location. For files that include the CUDA headers
// themselves (this header includes none, so host-only code can include it freely).
#pragma once

#include "afd/common/error.h"

#define AFD_CUDA_CHECK(call)                                                                      \
  do {                                                                                            \
    const cudaError_t afd_err_ = (call);                                                          \
    AFD_CHECK(afd_err_ == cudaSuccess, "{} failed: {} ({})", #call, cudaGetErrorString(afd_err_), \
              static_cast<int>(afd_err_));                                                        \
  } while (0)

#define AFD_CUBLAS_CHECK(call)                                               \
  do {                                                                       \
    const cublasStatus_t afd_st_ = (call);                                   \
    AFD_CHECK(afd_st_ == CUBLAS_STATUS_SUCCESS, "{} failed: {} ({})", #call, \
              cublasGetStatusString(afd_st_), static_cast<int>(afd_st_));    \
  } while (0)

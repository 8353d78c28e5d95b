// AFD_HOST_DEVICE: an inline function both the host and CUDA kernels call (the CPU reference and
// the GPU compute the same rule from one definition).
#pragma once

#ifdef __CUDACC__
#define AFD_HOST_DEVICE __host__ __device__
#else
#define AFD_HOST_DEVICE
#endif

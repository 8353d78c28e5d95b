// Elementwise and per-row ops, programmatic dependent launch and the running-code probe
// (elementwise.cu).
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// elementwise.cu
// Programmatic dependent launch (pdl.cuh): whether this thread's launches carry the attribute
// (the current device is sm_90+, AFD_PDL is not 0, and SetPdlForThread(true) was the last call
// on this thread; off until then).
bool PdlEnabled();
void SetPdlForThread(bool on);
// What the code the device runs was built for: __CUDA_ARCH__ (900 for sm_90 / sm_90a code, 800
// for compute_80 PTX whatever the device) and whether it has sm_90a's features (wgmma). A probe
// kernel launched and read back once, at the first call (CudaBackend's constructor makes it,
// outside any capture; the process's first device is the one probed).
struct RunningCode {
  int arch = 0;
  bool sm90a = false;
};
RunningCode ProbeRunningCode();
void LaunchFill(float* x, int64_t n, float value, cudaStream_t s);
void LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t s);
void LaunchSiluMul(const float* gate_up, int64_t n, int64_t inter, float* out, cudaStream_t s);
void LaunchToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t s);
// table: [V, H] f32 (bf16 = false) or bf16 bits.
void LaunchEmbedding(const void* table, bool bf16, const int32_t* ids, int64_t n, int64_t h,
                     float* out, cudaStream_t s);
void LaunchGatherRows(const float* x, const int32_t* index, int64_t m, int64_t h, float* out,
                      cudaStream_t s);
void LaunchRmsNorm(const float* x, int64_t n, int64_t d, const float* w, float eps, float* out,
                   cudaStream_t s);
// y += x, then out = RmsNorm(y) in one pass over the rows (the same values as LaunchAdd then
// LaunchRmsNorm).
void LaunchAddRmsNorm(float* y, const float* x, int64_t n, int64_t d, const float* w, float eps,
                      float* out, cudaStream_t s);

}  // namespace afd::kernels::cuda

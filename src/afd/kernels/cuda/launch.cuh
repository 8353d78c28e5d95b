// Launchers of the CUDA backend's kernels: raw device pointers and a stream in, nothing else
// (no Tensors, no CUDA types beyond cudaStream_t). Each .cu file implements one op family and
// declares its launchers in its own header (afd.cuh, elementwise.cuh, gemv.cuh, mla.cuh,
// gqa.cuh, router.cuh, moe.cuh, sample.cuh; attention_args.cuh for what MLA and GQA share),
// whose comments state each launcher's contract; shapes follow kernels/backend.h. A launcher
// checks its launch (cudaGetLastError) and throws afd::Error on failure. This header holds what
// every family uses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// Throws afd::Error naming `what` when the last launch failed.
void CheckLaunch(const char* what);
// A kernel choice turned off by the environment: NAME=0 (AFD_MLA_TILES, AFD_MOE_WGMMA,
// AFD_SIDE_STREAM), to measure a form against the one it replaced in the same run.
bool ChoiceOff(const char* name);
// A form forced by the environment: NAME=c, a whole number from 1 to max (AFD_MLA_WG); 0 when
// NAME is unset or empty. Anything else is an error naming NAME. (Forms forced only for
// benchmarks are Backend::FormOverrides, set by flags.)
int64_t ChoiceCount(const char* name, int64_t max);

}  // namespace afd::kernels::cuda

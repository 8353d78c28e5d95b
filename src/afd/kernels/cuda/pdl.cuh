// Programmatic dependent launch (Hopper): the backend's kernels are launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, so a kernel's blocks may be scheduled
// while the kernel before it in the stream is still running (in a CUDA graph too: the edge
// becomes programmatic). Correctness rests on every such kernel calling PdlStart() before it
// reads anything a kernel may have written or writes anything (loads of weights, which nothing
// writes, may come before it: the GEMVs issue their first ones there); griddepcontrol.wait
// blocks until the previous grid has completed and its memory is visible,
// exactly the ordering of a plain launch; then griddepcontrol.launch_dependents lets the next
// kernel's blocks be scheduled once all of this one's have started. What overlaps is the
// launch and the scheduling of the next kernel's blocks (~1 us per kernel boundary in a graph,
// ~650 boundaries in a batch-1 decode step of deepseek-v2-lite), never a read of unfinished
// data. Off before sm_90, with AFD_PDL=0, and for steps over kPdlMaxRows rows (plain launches;
// PdlStart is then a no-op).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/elementwise.cuh"  // PdlEnabled
#include "afd/kernels/cuda/launch.cuh"       // ChoiceOff

namespace afd::kernels::cuda {

__device__ __forceinline__ void PdlStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...) with the attribute (when PdlEnabled). The kernel
// must call PdlStart() before touching memory other kernels write.
template <typename... Params, typename... Args>
void LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
               Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = s;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = PdlEnabled() ? 1 : 0;
  AFD_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace afd::kernels::cuda

// Kernel trace of the CUDA backend (Backend::SetKernelTrace): CUPTI's concurrent-kernel activity
// records, libcupti loaded at the first start (the error names the library when it cannot be).
// CUPTI's activity collection is process-wide: one trace at a time.
#pragma once

#include <vector>

#include "afd/kernels/backend.h"

namespace afd::kernels::cuda {

void StartKernelTrace();
// Flushes the records and stops; the spans since StartKernelTrace, by start. The caller waits
// for the device first. Throws afd::Error when CUPTI dropped records (the spans would lie).
std::vector<KernelSpan> StopKernelTrace();
bool KernelTraceOn();

}  // namespace afd::kernels::cuda

// Where a decode step's device time goes, from a kernel trace (Backend::TakeKernelTrace) of CUDA
// graph replays: per kernel name its time and the part of it no other kernel ran beside (the
// time it alone kept the step going), and the step's idle and overlapped time. `afd bench
// decode --kernel-trace` prints it; unlike --profile (eager, CUDA events per op) it sees the
// graph as it runs, programmatic launches' overlap included.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "afd/kernels/backend.h"

namespace afd::diag {

struct KernelTraceRow {
  std::string name;
  double calls = 0;         // per step
  double ms = 0;            // its kernels' time per step, summed
  double exclusive_ms = 0;  // per step: the time it was the only kernel running
};

struct KernelTraceSummary {
  int64_t steps = 0;
  double span_ms = 0;     // per step: from its first kernel's start to the next step's
  double idle_ms = 0;     // per step: no kernel running
  double overlap_ms = 0;  // per step: two or more kernels running
  std::vector<KernelTraceRow> kernels;     // longest `ms` first
  std::vector<kernels::KernelSpan> spans;  // the summarized replays' kernels, by start
};

// The graph replays among `spans` (kernels of one graph and one launch id; kernels launched on
// their own belong to the replay they start within) in launch order; replays [first, first +
// count) are summarized, each from its first kernel's start to the next replay's (the last
// replay of the trace: to its last kernel's end). Throws afd::Error when the trace holds fewer
// replays (e.g. eager steps: no graphs).
KernelTraceSummary SummarizeKernelTrace(const std::vector<kernels::KernelSpan>& spans,
                                        int64_t first, int64_t count);

}  // namespace afd::diag

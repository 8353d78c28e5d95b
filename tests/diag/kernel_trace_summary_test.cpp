// SummarizeKernelTrace: graph replays found by (graph, launch id), each step's window from its
// first kernel to the next replay's, and every instant of it counted once: idle, one kernel's
// alone, or overlapped.
#include "afd/diag/kernel_trace_summary.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "afd/common/error.h"

namespace afd::diag {
namespace {

kernels::KernelSpan Span(const std::string& name, uint32_t graph, uint32_t launch,
                         uint64_t start_us, uint64_t end_us) {
  kernels::KernelSpan s;
  s.name = name;
  s.graph = graph;
  s.launch = launch;
  s.start_ns = start_us * 1000;
  s.end_ns = end_us * 1000;
  return s;
}

const KernelTraceRow& Row(const KernelTraceSummary& s, const std::string& name) {
  for (const KernelTraceRow& r : s.kernels) {
    if (r.name == name) return r;
  }
  ADD_FAILURE() << "no row " << name;
  static const KernelTraceRow none;
  return none;
}

TEST(KernelTraceSummary, EveryInstantOfAStepIsIdleOneKernelsOrOverlapped) {
  const std::vector<kernels::KernelSpan> spans = {
      Span("Early", 0, 5, 40, 120),     // before the first replay, still running at its start
      Span("Gemv", 1, 10, 100, 200),    // replay 0
      Span("Mla", 1, 10, 190, 300),     // overlaps Gemv for 10 us (a programmatic launch)
      Span("Sample", 0, 12, 320, 350),  // launched on its own, inside replay 0's window
      Span("Gemv", 1, 11, 400, 500),    // replay 1
      Span("Mla", 1, 11, 500, 650),
      Span("Gemv", 1, 13, 700, 800),  // replay 2: ends replay 1's window
  };
  const KernelTraceSummary s = SummarizeKernelTrace(spans, 0, 2);
  EXPECT_EQ(s.steps, 2);
  // Window [100, 700) us over two steps.
  EXPECT_NEAR(s.span_ms, 0.3, 1e-12);
  // Early overlaps Gemv over [100, 120): 20 us; Gemv and Mla over [190, 200): 10 us.
  EXPECT_NEAR(s.overlap_ms, 0.015, 1e-12);
  EXPECT_NEAR(s.idle_ms, 0.06, 1e-12);  // [300, 320), [350, 400), [650, 700)
  EXPECT_NEAR(Row(s, "Gemv").calls, 1.0, 1e-12);
  EXPECT_NEAR(Row(s, "Gemv").ms, 0.1, 1e-12);
  EXPECT_NEAR(Row(s, "Gemv").exclusive_ms, 0.085, 1e-12);  // [120, 190) + [400, 500), halved
  EXPECT_NEAR(Row(s, "Mla").ms, 0.13, 1e-12);
  EXPECT_NEAR(Row(s, "Mla").exclusive_ms, 0.125, 1e-12);
  EXPECT_NEAR(Row(s, "Sample").calls, 0.5, 1e-12);
  EXPECT_NEAR(Row(s, "Sample").exclusive_ms, 0.015, 1e-12);
  // The window's kernels, by start: the two replays and the one launched inside them.
  ASSERT_EQ(s.spans.size(), 5u);
  EXPECT_EQ(s.spans.front().name, "Gemv");
  EXPECT_EQ(s.spans[2].name, "Sample");
  EXPECT_EQ(s.spans.back().start_ns, 500000u);
  EXPECT_EQ(s.kernels.front().name, "Mla");  // longest first
  double accounted = s.idle_ms + s.overlap_ms;
  for (const KernelTraceRow& r : s.kernels) accounted += r.exclusive_ms;
  EXPECT_NEAR(accounted, s.span_ms, 1e-12);
  // The last replay of a trace runs to its last kernel's end.
  const KernelTraceSummary last = SummarizeKernelTrace(spans, 2, 1);
  EXPECT_NEAR(last.span_ms, 0.1, 1e-12);
  EXPECT_NEAR(last.idle_ms, 0.0, 1e-12);
}

TEST(KernelTraceSummary, TooFewReplaysAreNamed) {
  const std::vector<kernels::KernelSpan> eager = {Span("Gemv", 0, 1, 0, 10),
                                                  Span("Gemv", 0, 2, 20, 30)};
  try {
    SummarizeKernelTrace(eager, 0, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0 CUDA graph replays traced, 1 needed"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace afd::diag

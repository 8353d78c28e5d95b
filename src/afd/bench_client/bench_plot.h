// The picture of an `afd bench serve` run (--plot): histograms of TTFT, TPOT, ITL and E2E
// latency (ms, successful requests) and the output-token throughput over time (content chunks
// per 1-s bin), drawn on a Canvas and encoded as PNG. Thread safety: pure function.
#pragma once

#include <string>

#include "afd/bench_client/bench_serve.h"

namespace afd::bench_client {

inline constexpr int kBenchPlotWidth = 1200;
inline constexpr int kBenchPlotHeight = 900;

// PNG file bytes, kBenchPlotWidth x kBenchPlotHeight. A panel without values says "NO DATA".
std::string BenchServePlotPng(const BenchServeRun& run);

}  // namespace afd::bench_client

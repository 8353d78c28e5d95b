#include "afd/diag/kernel_trace_summary.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "afd/common/error.h"

namespace afd::diag {

KernelTraceSummary SummarizeKernelTrace(const std::vector<kernels::KernelSpan>& spans,
                                        int64_t first, int64_t count) {
  AFD_CHECK(first >= 0 && count >= 1, "kernel trace: replays [{}, {} + {}) is not a range", first,
            first, count);
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> replay_start;  // (graph, launch) -> start
  uint64_t last_end = 0;
  for (const kernels::KernelSpan& s : spans) {
    last_end = std::max(last_end, s.end_ns);
    if (s.graph == 0) continue;
    auto [it, added] = replay_start.emplace(std::make_pair(s.graph, s.launch), s.start_ns);
    if (!added) it->second = std::min(it->second, s.start_ns);
  }
  std::vector<uint64_t> starts;
  for (const auto& [key, start] : replay_start) starts.push_back(start);
  std::sort(starts.begin(), starts.end());
  AFD_CHECK(first + count <= static_cast<int64_t>(starts.size()),
            "kernel trace: {} CUDA graph replays traced, {} needed (the trace summarizes graph "
            "replays: not with eager steps)",
            starts.size(), first + count);
  const uint64_t begin = starts[first];
  const uint64_t end =
      first + count < static_cast<int64_t>(starts.size()) ? starts[first + count] : last_end;

  // A sweep over every kernel boundary: each segment of [begin, end) is idle, one kernel's
  // alone, or overlapped.
  std::vector<std::pair<uint64_t, int64_t>> events;  // (time, +(i + 1) start / -(i + 1) end)
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].end_ns <= spans[i].start_ns) continue;
    events.push_back({spans[i].start_ns, static_cast<int64_t>(i) + 1});
    events.push_back({spans[i].end_ns, -static_cast<int64_t>(i) - 1});
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;  // ends first
  });
  KernelTraceSummary out;
  std::map<std::string, KernelTraceRow> rows;
  double idle_ns = 0, overlap_ns = 0;
  std::set<size_t> active;
  uint64_t t = begin;
  for (size_t e = 0; e <= events.size(); ++e) {
    const uint64_t next = e < events.size() ? events[e].first : end;
    const uint64_t a = std::max(t, begin), b = std::min(next, end);
    if (b > a) {
      const double len = static_cast<double>(b - a);
      if (active.empty()) {
        idle_ns += len;
      } else if (active.size() == 1) {
        KernelTraceRow& r = rows[spans[*active.begin()].name];
        r.exclusive_ms += len / 1e6;
      } else {
        overlap_ns += len;
      }
    }
    if (e == events.size() || next >= end) break;
    t = next;
    const int64_t id = events[e].second;
    if (id > 0) {
      active.insert(static_cast<size_t>(id - 1));
    } else {
      active.erase(static_cast<size_t>(-id - 1));
    }
  }
  for (const kernels::KernelSpan& s : spans) {
    if (s.start_ns < begin || s.start_ns >= end) continue;
    out.spans.push_back(s);
    KernelTraceRow& r = rows[s.name];
    r.calls += 1;
    r.ms += static_cast<double>(s.end_ns - std::min(s.end_ns, s.start_ns)) / 1e6;
  }
  out.steps = count;
  const double n = static_cast<double>(count);
  out.span_ms = static_cast<double>(end - begin) / 1e6 / n;
  out.idle_ms = idle_ns / 1e6 / n;
  out.overlap_ms = overlap_ns / 1e6 / n;
  for (auto& [name, r] : rows) {
    r.name = name;
    r.calls /= n;
    r.ms /= n;
    r.exclusive_ms /= n;
    out.kernels.push_back(r);
  }
  std::sort(out.kernels.begin(), out.kernels.end(),
            [](const KernelTraceRow& a, const KernelTraceRow& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace afd::diag

#include "afd/bench_client/bench_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "afd/bench_client/png_writer.h"
#include "afd/bench_client/raster.h"

namespace afd::bench_client {

namespace {

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kInk{30, 30, 30};
constexpr Rgb kGrid{225, 225, 225};
constexpr Rgb kBar{70, 110, 180};
constexpr Rgb kLine{200, 80, 40};
constexpr int kBins = 20;

struct Rect {
  int x, y, w, h;
};

std::string Tick(double v) {
  const double a = std::fabs(v);
  if (a >= 1000) return fmt::format("{:.0f}", v);
  if (a >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

// Title, axes, horizontal grid and y labels (0 .. y_max); returns the plotting area.
Rect Frame(Canvas& c, Rect r, const std::string& title, double y_max) {
  c.Text(r.x, r.y, title, kInk, 2);
  const Rect area{r.x + 70, r.y + 26, r.w - 90, r.h - 26 - 28};
  for (int k = 0; k <= 4; ++k) {
    const int y = area.y + area.h - area.h * k / 4;
    c.Line(area.x, y, area.x + area.w, y, kGrid);
    const std::string label = Tick(y_max * k / 4);
    c.Text(area.x - 8 - Canvas::TextWidth(label), y - 3, label, kInk);
  }
  c.Line(area.x, area.y, area.x, area.y + area.h, kInk);
  c.Line(area.x, area.y + area.h, area.x + area.w, area.y + area.h, kInk);
  return area;
}

// Labels under the x axis at its start, middle and end.
void XLabels(Canvas& c, Rect area, double lo, double hi, const std::string& unit) {
  const int y = area.y + area.h + 8;
  const std::string first = Tick(lo), mid = Tick((lo + hi) / 2), last = Tick(hi) + " " + unit;
  c.Text(area.x, y, first, kInk);
  c.Text(area.x + area.w / 2 - Canvas::TextWidth(mid) / 2, y, mid, kInk);
  c.Text(area.x + area.w - Canvas::TextWidth(last), y, last, kInk);
}

void NoData(Canvas& c, Rect area) {
  c.Text(area.x + area.w / 2 - Canvas::TextWidth("NO DATA", 2) / 2, area.y + area.h / 2 - 7,
         "NO DATA", kInk, 2);
}

void Histogram(Canvas& c, Rect r, const std::string& name, const std::vector<double>& values_ms) {
  const std::string title =
      fmt::format("{} (ms): {} values, count per bin", name, values_ms.size());
  if (values_ms.empty()) {
    NoData(c, Frame(c, r, title, 1.0));
    return;
  }
  const auto [min_it, max_it] = std::minmax_element(values_ms.begin(), values_ms.end());
  const double lo = *min_it;
  const double hi = *max_it > lo ? *max_it : lo + 1.0;
  std::vector<int64_t> counts(kBins, 0);
  for (const double v : values_ms) {
    ++counts[std::min<size_t>(kBins - 1, size_t((v - lo) / (hi - lo) * kBins))];
  }
  const double top = static_cast<double>(*std::max_element(counts.begin(), counts.end()));
  const Rect area = Frame(c, r, title, top);
  for (int b = 0; b < kBins; ++b) {
    const int x0 = area.x + 1 + area.w * b / kBins;
    const int x1 = area.x + area.w * (b + 1) / kBins;
    const int h = static_cast<int>(std::lround(area.h * static_cast<double>(counts[b]) / top));
    c.FillRect(x0 + 1, area.y + area.h - h, std::max(1, x1 - x0 - 1), h, kBar);
  }
  XLabels(c, area, lo, hi, "ms");
}

void Throughput(Canvas& c, Rect r, const std::vector<double>& per_second) {
  const std::string title = "Output tokens/s over time (1-s bins)";
  if (per_second.empty()) {
    NoData(c, Frame(c, r, title, 1.0));
    return;
  }
  const double top = std::max(1.0, *std::max_element(per_second.begin(), per_second.end()));
  const Rect area = Frame(c, r, title, top);
  const auto n = static_cast<int>(per_second.size());
  const auto px = [&](int i) { return area.x + (n == 1 ? area.w / 2 : area.w * i / (n - 1)); };
  const auto py = [&](int i) {
    return area.y + area.h - static_cast<int>(std::lround(area.h * per_second[i] / top));
  };
  for (int i = 0; i < n; ++i) {
    if (i > 0) c.Line(px(i - 1), py(i - 1), px(i), py(i), kLine);
    c.FillRect(px(i) - 2, py(i) - 2, 5, 5, kLine);
  }
  XLabels(c, area, 0, std::max(0, n - 1), "s");
}

}  // namespace

std::string BenchServePlotPng(const BenchServeRun& run) {
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestOutcome& o : run.outcomes) {
    if (!o.success) continue;
    ttft.push_back(o.ttft_s * 1000);
    e2el.push_back(o.latency_s * 1000);
    if (o.output_tokens > 1) {
      tpot.push_back((o.latency_s - o.ttft_s) / double(o.output_tokens - 1) * 1000);
    }
    for (const double gap : o.itl_s) itl.push_back(gap * 1000);
  }
  Canvas c(kBenchPlotWidth, kBenchPlotHeight, kWhite);
  c.Text(20, 12,
         fmt::format("afd bench serve: {} ok, {} failed, {:.2f} s", run.metrics.completed,
                     run.metrics.failed, run.duration_s),
         kInk, 2);
  const int half = kBenchPlotWidth / 2, row = (kBenchPlotHeight - 40) / 3;
  Histogram(c, {20, 40, half - 30, row - 10}, "TTFT", ttft);
  Histogram(c, {half + 10, 40, half - 30, row - 10}, "TPOT", tpot);
  Histogram(c, {20, 40 + row, half - 30, row - 10}, "ITL", itl);
  Histogram(c, {half + 10, 40 + row, half - 30, row - 10}, "E2E latency", e2el);
  Throughput(c, {20, 40 + 2 * row, kBenchPlotWidth - 40, row - 10}, run.metrics.tokens_per_second);
  return EncodePng(c.image());
}

}  // namespace afd::bench_client

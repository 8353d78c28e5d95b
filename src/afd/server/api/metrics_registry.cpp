#include "afd/server/api/metrics_registry.h"

#include <fmt/format.h>

#include <cmath>

#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"

namespace afd::server::api {

namespace {

const char* TypeName(int type) {
  static const char* const kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}

// Prometheus label values escape backslash, double quote and newline.
std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// `{a="1",b="2"}` with `extra` (le="...") last; "" without labels.
std::string LabelText(const MetricLabels& labels, const std::string& extra = "") {
  std::string out;
  for (const auto& [k, v] : labels) {
    out += out.empty() ? "{" : ",";
    out += k + "=\"" + EscapeLabel(v) + "\"";
  }
  if (!extra.empty()) out += (out.empty() ? "{" : ",") + extra;
  return out.empty() ? out : out + "}";
}

}  // namespace

void MetricsRegistry::Declare(const std::string& name, Type type, const std::string& help,
                              std::vector<double> bounds) {
  for (size_t i = 1; i < bounds.size(); ++i) {
    AFD_CHECK(bounds[i - 1] < bounds[i], "metric {}: bucket bounds must ascend", name);
  }
  MutexLock lock(mu_);
  AFD_CHECK(families_.count(name) == 0, "metric {} is declared twice", name);
  families_[name] = Family{type, help, std::move(bounds), {}};
}

void MetricsRegistry::DeclareCounter(const std::string& name, const std::string& help) {
  Declare(name, Type::kCounter, help, {});
}
void MetricsRegistry::DeclareGauge(const std::string& name, const std::string& help) {
  Declare(name, Type::kGauge, help, {});
}
void MetricsRegistry::DeclareHistogram(const std::string& name, const std::string& help,
                                       std::vector<double> bounds) {
  Declare(name, Type::kHistogram, help, std::move(bounds));
}

MetricsRegistry::Series& MetricsRegistry::Get(const std::string& name, Type type,
                                              const MetricLabels& labels) {
  const auto it = families_.find(name);
  AFD_CHECK(it != families_.end(), "metric {} is not declared", name);
  AFD_CHECK(it->second.type == type, "metric {} is a {}, not a {}", name,
            TypeName(static_cast<int>(it->second.type)), TypeName(static_cast<int>(type)));
  auto [series, inserted] = it->second.series.try_emplace(labels);
  if (inserted && type == Type::kHistogram) {
    series->second.bounds = it->second.bounds;
    series->second.cumulative.assign(it->second.bounds.size() + 1, 0);
  }
  return series->second;
}

void MetricsRegistry::Increment(const std::string& name, const MetricLabels& labels, double delta) {
  AFD_CHECK(delta >= 0, "counter {} cannot go down (delta {})", name, delta);
  MutexLock lock(mu_);
  Get(name, Type::kCounter, labels).value += delta;
}

void MetricsRegistry::Set(const std::string& name, const MetricLabels& labels, double value) {
  MutexLock lock(mu_);
  Get(name, Type::kGauge, labels).value = value;
}

void MetricsRegistry::Observe(const std::string& name, const MetricLabels& labels, double value) {
  MutexLock lock(mu_);
  Series& s = Get(name, Type::kHistogram, labels);
  for (size_t i = 0; i < s.bounds.size(); ++i) {
    if (value <= s.bounds[i]) ++s.cumulative[i];
  }
  ++s.cumulative.back();
  ++s.count;
  s.sum += value;
}

void MetricsRegistry::SetHistogram(const std::string& name, const MetricLabels& labels,
                                   const std::vector<double>& bounds,
                                   const std::vector<int64_t>& cumulative, int64_t count,
                                   double sum) {
  AFD_CHECK(cumulative.size() == bounds.size() + 1,
            "histogram {}: {} bucket counts for {} bounds (+Inf)", name, cumulative.size(),
            bounds.size());
  MutexLock lock(mu_);
  Series& s = Get(name, Type::kHistogram, labels);
  s.bounds = bounds;
  s.cumulative = cumulative;
  s.count = count;
  s.sum = sum;
}

std::string MetricsRegistry::Render() const {
  MutexLock lock(mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    out += "# HELP " + name + " " + family.help + "\n";
    out += "# TYPE " + name + " " + TypeName(static_cast<int>(family.type)) + "\n";
    for (const auto& [labels, s] : family.series) {
      if (family.type != Type::kHistogram) {
        out += name + LabelText(labels) + " " + FormatNumber(s.value) + "\n";
        continue;
      }
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        const std::string le =
            i < s.bounds.size() ? FormatNumber(s.bounds[i]) : std::string("+Inf");
        out += name + "_bucket" + LabelText(labels, "le=\"" + le + "\"") + " " +
               std::to_string(s.cumulative[i]) + "\n";
      }
      out += name + "_sum" + LabelText(labels) + " " + FormatNumber(s.sum) + "\n";
      out += name + "_count" + LabelText(labels) + " " + std::to_string(s.count) + "\n";
    }
  }
  return out;
}

}  // namespace afd::server::api

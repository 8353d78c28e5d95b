// A small Prometheus metrics registry: counters, gauges and histograms, each a family of series
// told apart by their labels, rendered in the Prometheus text exposition format (version 0.0.4).
// Families are declared once (name, help, and for a histogram its bucket upper bounds); updating
// an undeclared family, or a family as another type, throws afd::Error.
//
// Thread safety: every method may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "afd/common/thread_annotations.h"

namespace afd::server::api {

// Label name/value pairs of one series, e.g. {{"model_name", "m"}, {"finished_reason", "stop"}}.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsRegistry {
 public:
  void DeclareCounter(const std::string& name, const std::string& help);
  void DeclareGauge(const std::string& name, const std::string& help);
  // `bounds`: bucket upper bounds, strictly ascending; +Inf is implied.
  void DeclareHistogram(const std::string& name, const std::string& help,
                        std::vector<double> bounds);

  // Counters only go up: a negative delta throws.
  void Increment(const std::string& name, const MetricLabels& labels, double delta = 1.0);
  void Set(const std::string& name, const MetricLabels& labels, double value);
  void Observe(const std::string& name, const MetricLabels& labels, double value);
  // Replaces a histogram series with externally kept buckets (cumulative counts,
  // bounds.size() + 1 of them, the last being +Inf). Its bounds may differ from the declared
  // ones (the engines choose them); empty bounds with empty counts give only the +Inf bucket.
  void SetHistogram(const std::string& name, const MetricLabels& labels,
                    const std::vector<double>& bounds, const std::vector<int64_t>& cumulative,
                    int64_t count, double sum);

  // The text format: per family "# HELP", "# TYPE" then its series in label order.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    double value = 0.0;               // counter, gauge
    std::vector<double> bounds;       // histogram
    std::vector<int64_t> cumulative;  // histogram, bounds.size() + 1
    int64_t count = 0;
    double sum = 0.0;
  };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;
    std::map<MetricLabels, Series> series;
  };
  void Declare(const std::string& name, Type type, const std::string& help,
               std::vector<double> bounds);
  Series& Get(const std::string& name, Type type, const MetricLabels& labels) AFD_REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<std::string, Family> families_ AFD_GUARDED_BY(mu_);
};

}  // namespace afd::server::api

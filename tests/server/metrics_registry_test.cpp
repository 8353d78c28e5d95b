#include "afd/server/api/metrics_registry.h"

#include <gtest/gtest.h>

#include <thread>

#include "afd/common/error.h"

namespace afd::server::api {
namespace {

TEST(ServerApiMetricsRegistry, RendersTextFormat) {
  MetricsRegistry r;
  r.DeclareCounter("c_total", "A counter.");
  r.DeclareGauge("g", "A gauge.");
  r.DeclareHistogram("h", "A histogram.", {0.5, 1.0});
  r.Increment("c_total", {{"model_name", "m"}, {"reason", "a\"b"}}, 2);
  r.Increment("c_total", {{"model_name", "m"}, {"reason", "a\"b"}});
  r.Set("g", {}, 0.25);
  r.Observe("h", {{"model_name", "m"}}, 0.25);
  r.Observe("h", {{"model_name", "m"}}, 0.75);
  r.Observe("h", {{"model_name", "m"}}, 3.0);
  EXPECT_EQ(r.Render(),
            "# HELP c_total A counter.\n"
            "# TYPE c_total counter\n"
            "c_total{model_name=\"m\",reason=\"a\\\"b\"} 3\n"
            "# HELP g A gauge.\n"
            "# TYPE g gauge\n"
            "g 0.25\n"
            "# HELP h A histogram.\n"
            "# TYPE h histogram\n"
            "h_bucket{model_name=\"m\",le=\"0.5\"} 1\n"
            "h_bucket{model_name=\"m\",le=\"1\"} 2\n"
            "h_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"
            "h_sum{model_name=\"m\"} 4\n"
            "h_count{model_name=\"m\"} 3\n");
}

TEST(ServerApiMetricsRegistry, ExternalHistogramAndMisuse) {
  MetricsRegistry r;
  r.DeclareHistogram("rt", "Round trips.", {});
  r.SetHistogram("rt", {}, {0.001, 0.01}, {1, 4, 5}, 5, 0.02);
  EXPECT_NE(r.Render().find("rt_bucket{le=\"0.01\"} 4\n"), std::string::npos);
  EXPECT_NE(r.Render().find("rt_bucket{le=\"+Inf\"} 5\n"), std::string::npos);
  EXPECT_THROW(r.SetHistogram("rt", {}, {0.1}, {1}, 1, 0.0), Error);  // counts != bounds + 1
  EXPECT_THROW(r.Increment("nope", {}), Error);
  EXPECT_THROW(r.Set("rt", {}, 1.0), Error);  // a histogram, not a gauge
  r.DeclareCounter("c", "c");
  EXPECT_THROW(r.Increment("c", {}, -1.0), Error);
  EXPECT_THROW(r.DeclareCounter("c", "again"), Error);
  EXPECT_THROW(r.DeclareHistogram("h", "h", {1.0, 0.5}), Error);
}

TEST(ServerApiMetricsRegistry, ConcurrentUpdates) {
  MetricsRegistry r;
  r.DeclareCounter("c", "c");
  r.DeclareHistogram("h", "h", {1.0});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        r.Increment("c", {});
        r.Observe("h", {}, 0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(r.Render().find("c 4000\n"), std::string::npos);
  EXPECT_NE(r.Render().find("h_count 4000\n"), std::string::npos);
}

}  // namespace
}  // namespace afd::server::api

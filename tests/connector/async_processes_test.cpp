// The asynchronous window connector across real processes (afd connector-test with
// AsyncAFDConnector): every row encodes its sender and token; the FFN side checks origin,
// expert ownership and shared-token ownership, the attention side every returned row.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "connector/deployment.h"

namespace afd {
namespace {

using testing_util::ReadFile;
using testing_util::StartDeployment;

constexpr const char* kAsync = "AsyncAFDConnector";

struct Shape {
  int A, F;
};

class AsyncRoundTrip : public ::testing::TestWithParam<Shape> {};

TEST_P(AsyncRoundTrip, EveryRowComesBackFromTheRightPlace) {
  const auto [A, F] = GetParam();
  const std::string tag = "async" + std::to_string(A) + "a" + std::to_string(F) + "f";
  // Two stages in flight at once (ring depth 2); the worst-case multiplier (F) admits any
  // routing skew.
  auto procs = StartDeployment(
      A, F, 30, tag,
      [](const std::string&, int) {
        return std::vector<std::string>{"--layers", "3", "--stages", "2", "--steps", "4"};
      },
      ", \"connector_extra_config\": {\"ring_depth\": 2, \"routed_cap_multiplier\": " +
          std::to_string(F) + "}",
      kAsync);
  int64_t total_checked = 0;
  for (auto& p : procs) {
    const std::optional<int> status = p.process->Wait(Deadline::In(60));
    const std::string log = ReadFile(p.log);
    ASSERT_EQ(status, 0) << p.label << " failed:\n" << log;
    const nlohmann::json report = nlohmann::json::parse(log);
    total_checked += report["rows_checked"].get<int64_t>();
  }
  EXPECT_GT(total_checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Topologies, AsyncRoundTrip,
                         ::testing::Values(Shape{1, 1}, Shape{2, 2}, Shape{3, 2}, Shape{1, 2},
                                           Shape{2, 5}),
                         [](const auto& info) {
                           return std::to_string(info.param.A) + "A" +
                                  std::to_string(info.param.F) + "F";
                         });

TEST(AsyncProcesses, Bf16RowsRoundTrip) {
  auto procs = StartDeployment(
      2, 2, 30, "async_bf16",
      [](const std::string&, int) {
        return std::vector<std::string>{"--dtype", "bf16", "--hidden", "40",
                                        "--steps", "2",    "--stages", "1"};
      },
      ", \"connector_extra_config\": {\"routed_cap_multiplier\": 2}", kAsync);
  for (auto& p : procs) {
    EXPECT_EQ(p.process->Wait(Deadline::In(60)), 0) << p.label << ":\n" << ReadFile(p.log);
  }
}

// --bench: n rows a round trip, split over the FFN ranks and echoed; every row count reported,
// the echo checked (a wrong row fails the run). Host rows: no stream-side timing.
TEST(AsyncProcesses, BenchReportsEveryRowCount) {
  auto procs = StartDeployment(
      1, 2, 30, "async_bench",
      [](const std::string&, int) {
        return std::vector<std::string>{"--bench", "--bench-rows", "1,7", "--iters",
                                        "3",       "--hidden",     "16"};
      },
      "", kAsync);
  const nlohmann::json bench = testing_util::BenchReportOf(procs);
  ASSERT_EQ(bench.size(), 2u);
  EXPECT_FALSE(bench[1].contains("stream_median_us")) << bench.dump();
}

// No connection closes when a window peer dies: the survivors notice the process is gone and
// name it, long before the timeout.
TEST(AsyncProcesses, KilledPeerIsNamedByTheOthers) {
  for (const std::string victim : {"attention", "ffn"}) {
    const auto start = std::chrono::steady_clock::now();
    auto procs = StartDeployment(
        2, 2, 30, "async_kill_" + victim,
        [&](const std::string& role, int r) {
          std::vector<std::string> a = {"--steps", "50", "--stages", "1"};
          if (role == victim && r == 1) a.insert(a.end(), {"--die-at-step", "2"});
          return a;
        },
        ", \"connector_extra_config\": {\"routed_cap_multiplier\": 2}", kAsync);
    for (auto& p : procs) {
      const std::optional<int> status = p.process->Wait(Deadline::In(60));
      ASSERT_TRUE(status.has_value()) << p.label;
      const std::string log = ReadFile(p.log);
      if (p.label == victim + " 1") {
        EXPECT_EQ(*status, 128 + SIGKILL);
        continue;
      }
      EXPECT_NE(*status, 0) << p.label << ":\n" << log;
      EXPECT_NE(log.find("(" + victim + " 1)"), std::string::npos) << p.label << ":\n" << log;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << victim;
  }
}

}  // namespace
}  // namespace afd

// The P2P connector across real processes on loopback: every row encodes its sender and token,
// and both sides check origin, order and the FFN function (afd connector-test).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "connector/deployment.h"

namespace afd {
namespace {

using testing_util::ReadFile;
using testing_util::StartDeployment;

struct Shape {
  int A, F;
};

class P2pRoundTrip : public ::testing::TestWithParam<Shape> {};

TEST_P(P2pRoundTrip, EveryRowComesBackFromTheRightPlace) {
  const auto [A, F] = GetParam();
  const std::string tag = "rt" + std::to_string(A) + "a" + std::to_string(F) + "f";
  auto procs = StartDeployment(A, F, 30, tag, [](const std::string&, int) {
    return std::vector<std::string>{"--layers", "3", "--stages", "2", "--steps", "4"};
  });
  int64_t total_checked = 0;
  for (auto& p : procs) {
    const std::optional<int> status = p.process->Wait(Deadline::In(60));
    const std::string log = ReadFile(p.log);
    ASSERT_EQ(status, 0) << p.label << " failed:\n" << log;
    const nlohmann::json report = nlohmann::json::parse(log);
    ASSERT_EQ(report["layers"].size(), 3u) << log;
    total_checked += report["rows_checked"].get<int64_t>();
  }
  EXPECT_GT(total_checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Topologies, P2pRoundTrip,
                         ::testing::Values(Shape{1, 1}, Shape{2, 1}, Shape{4, 2}, Shape{3, 2},
                                           Shape{1, 2}, Shape{2, 5}, Shape{5, 3}),
                         [](const auto& info) {
                           return std::to_string(info.param.A) + "A" +
                                  std::to_string(info.param.F) + "F";
                         });

TEST(P2pProcesses, Bf16RowsRoundTrip) {
  auto procs = StartDeployment(3, 2, 30, "bf16", [](const std::string&, int) {
    return std::vector<std::string>{"--dtype", "bf16", "--hidden", "40", "--steps", "2"};
  });
  for (auto& p : procs) {
    EXPECT_EQ(p.process->Wait(Deadline::In(60)), 0) << p.label << ":\n" << ReadFile(p.log);
  }
}

// --bench times round trips through the connector; --raw through its transport's send/recv
// alone (the baseline the connector is compared with). Both report every row count.
TEST(P2pProcesses, BenchAndRawBenchReportEveryRowCount) {
  for (const bool raw : {false, true}) {
    auto procs =
        StartDeployment(1, 1, 30, raw ? "rawbench" : "bench", [&](const std::string&, int) {
          std::vector<std::string> a = {"--bench", "--bench-rows", "1,7", "--iters",
                                        "3",       "--hidden",     "16"};
          if (raw) a.push_back("--raw");
          return a;
        });
    EXPECT_EQ(testing_util::BenchReportOf(procs).size(), 2u);
  }
  // --raw pairs one attention rank with one FFN rank.
  auto procs = StartDeployment(2, 1, 30, "rawbench2a", [](const std::string&, int) {
    return std::vector<std::string>{"--bench", "--raw", "--iters", "2"};
  });
  for (auto& p : procs) {
    EXPECT_NE(p.process->Wait(Deadline::In(60)), 0) << p.label;
    EXPECT_NE(ReadFile(p.log).find("--raw times one attention rank and one FFN rank"),
              std::string::npos)
        << ReadFile(p.log);
  }
}

TEST(P2pProcesses, ConfigMismatchFailsBothNamingTheField) {
  const auto start = std::chrono::steady_clock::now();
  auto procs = StartDeployment(1, 1, 10, "mismatch", [](const std::string& role, int) {
    return std::vector<std::string>{"--hidden", role == "ffn" ? "64" : "96"};
  });
  for (auto& p : procs) {
    const std::optional<int> status = p.process->Wait(Deadline::In(30));
    const std::string log = ReadFile(p.log);
    ASSERT_TRUE(status.has_value()) << p.label << " hung";
    EXPECT_NE(*status, 0) << p.label << ":\n" << log;
    EXPECT_NE(log.find("hidden_size"), std::string::npos) << p.label << ":\n" << log;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(P2pProcesses, DuplicateRoleRankIsNamed) {
  auto procs = StartDeployment(2, 1, 5, "dup2", [](const std::string& role, int r) {
    // attention rank 1 claims rank 0 too
    if (role == "attention" && r == 1) return std::vector<std::string>{"--role-rank", "0"};
    return std::vector<std::string>{};
  });
  bool named = false;
  for (auto& p : procs) {
    const std::optional<int> status = p.process->Wait(Deadline::In(30));
    ASSERT_TRUE(status.has_value()) << p.label << " hung";
    EXPECT_NE(*status, 0) << p.label;
    named |= ReadFile(p.log).find("duplicate role rank: attention rank 0") != std::string::npos;
  }
  EXPECT_TRUE(named);
}

TEST(P2pProcesses, KilledPeerIsNamedByTheOthers) {
  const auto start = std::chrono::steady_clock::now();
  auto procs = StartDeployment(2, 2, 20, "kill", [](const std::string& role, int r) {
    std::vector<std::string> a = {"--steps", "50"};
    if (role == "attention" && r == 1) a = {"--steps", "50", "--die-at-step", "2"};
    return a;
  });
  for (auto& p : procs) {
    const std::optional<int> status = p.process->Wait(Deadline::In(40));
    const std::string log = ReadFile(p.log);
    ASSERT_TRUE(status.has_value()) << p.label << " hung";
    if (p.label == "attention 1") {
      EXPECT_EQ(*status, 128 + SIGKILL);
      continue;
    }
    EXPECT_NE(*status, 0) << p.label << ":\n" << log;
    EXPECT_NE(log.find("attention 1"), std::string::npos) << p.label << ":\n" << log;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(25));
}

TEST(P2pProcesses, StoppedPeerIsDetectedAndNamed) {
  // A live but wedged process (SIGSTOP: its connections stay open, nothing moves) is named by
  // the others within a few timeouts, by their heartbeat watch or their transfer deadline.
  const int timeout_s = 2;
  auto procs = StartDeployment(2, 1, timeout_s, "stopped", [](const std::string&, int) {
    return std::vector<std::string>{"--steps", "1000000"};
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // joined and stepping
  testing_util::RankProcess& stopped = procs.back();             // attention 1
  ASSERT_FALSE(stopped.process->Poll().has_value()) << ReadFile(stopped.log);
  const auto start = std::chrono::steady_clock::now();
  ::kill(stopped.process->pid(), SIGSTOP);
  for (size_t i = 0; i + 1 < procs.size(); ++i) {
    const std::optional<int> status = procs[i].process->Wait(Deadline::In(8 * timeout_s));
    const std::string log = ReadFile(procs[i].log);
    ASSERT_TRUE(status.has_value()) << procs[i].label << " did not notice the stopped peer";
    EXPECT_NE(*status, 0);
    EXPECT_TRUE(log.find("attention 1") != std::string::npos ||
                log.find("attention rank 1") != std::string::npos)
        << procs[i].label << ":\n"
        << log;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4 * timeout_s + 3));
  stopped.process->Kill(SIGKILL);  // a stopped process still dies of SIGKILL
}

TEST(P2pProcesses, MissingRankTimesOutListingIt) {
  // 2A1F with attention rank 1 never started.
  auto procs = StartDeployment(2, 1, 2, "missing",
                               [](const std::string&, int) { return std::vector<std::string>{}; });
  procs.back().process->Kill(SIGKILL);  // attention 1, before it could join
  for (size_t i = 0; i + 1 < procs.size(); ++i) {
    const std::optional<int> status = procs[i].process->Wait(Deadline::In(20));
    const std::string log = ReadFile(procs[i].log);
    ASSERT_TRUE(status.has_value()) << procs[i].label << " hung";
    EXPECT_NE(*status, 0);
    EXPECT_TRUE(log.find("attention rank 1") != std::string::npos ||
                log.find("(attention 1)") != std::string::npos)
        << procs[i].label << ":\n"
        << log;
  }
}

}  // namespace
}  // namespace afd

namespace afd {
namespace {

TEST(P2pProcesses, OutOfRangeRoleRankIsNamedEverywhere) {
  auto procs = testing_util::StartDeployment(2, 1, 10, "range", [](const std::string& role, int r) {
    if (role == "attention" && r == 1) return std::vector<std::string>{"--role-rank", "5"};
    return std::vector<std::string>{};
  });
  for (auto& p : procs) {
    const std::optional<int> status = p.process->Wait(Deadline::In(30));
    const std::string log = testing_util::ReadFile(p.log);
    ASSERT_TRUE(status.has_value()) << p.label << " hung";
    EXPECT_NE(*status, 0) << p.label;
    EXPECT_NE(log.find("attention rank 5 is out of range: num_attention_ranks is 2"),
              std::string::npos)
        << p.label << ":\n"
        << log;
  }
}

}  // namespace
}  // namespace afd

// Test helper: starts one `afd connector-test` process per rank of an xAyF deployment on this
// host, with logs in the test's temp dir.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "afd/comm/socket.h"
#include "afd/common/subprocess.h"
#include "testing/files.h"

namespace afd::testing_util {

// A port that was free a moment ago, outside the ephemeral range.
inline int FreePort() { return comm::PickRendezvousPort(); }

struct RankProcess {
  std::string label;  // "ffn 0", "attention 2"
  std::string log;
  std::unique_ptr<Subprocess> process;
};

inline std::string AfdJson(const std::string& role, int port, int A, int F, int timeout_s,
                           const std::string& extra = "",
                           const std::string& connector = "P2pHostAFDConnector") {
  return "{\"afd\": {\"role\": \"" + role + "\", \"connector\": \"" + connector + "\", " +
         "\"host\": \"127.0.0.1\", \"port\": " + std::to_string(port) +
         ", \"num_attention_ranks\": " + std::to_string(A) +
         ", \"num_ffn_ranks\": " + std::to_string(F) +
         ", \"afd_process_group_timeout_s\": " + std::to_string(timeout_s) + extra + "}}";
}

// Starts F FFN then A attention processes. extra_args(role, rank) adds per-rank flags;
// `config_extra` (", \"key\": value ...") and `connector` go into every rank's afd object.
template <typename ExtraArgs>
std::vector<RankProcess> StartDeployment(int A, int F, int timeout_s, const std::string& tag,
                                         ExtraArgs extra_args, const std::string& config_extra = "",
                                         const std::string& connector = "P2pHostAFDConnector") {
  const int port = FreePort();
  // Every process proves one join secret to the store, as a real deployment does (inherited).
  setenv("AFD_JOIN_SECRET", "connector-test-join-secret-0123456789", /*overwrite=*/0);
  std::vector<RankProcess> procs;
  for (const std::string role : {"ffn", "attention"}) {
    const int n = role == "ffn" ? F : A;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> argv = {
          AFD_BINARY,
          "connector-test",
          "--additional-config",
          AfdJson(role, port, A, F, timeout_s, config_extra, connector),
          "--role-rank",
          std::to_string(r)};
      for (const auto& a : extra_args(role, r)) argv.push_back(a);
      RankProcess p;
      p.label = role + " " + std::to_string(r);
      p.log = ::testing::TempDir() + "/afd_" + std::to_string(getpid()) + "_" + tag + "_" + role +
              std::to_string(r) + ".log";
      std::remove(p.log.c_str());
      p.process = std::make_unique<Subprocess>(argv, p.log);
      procs.push_back(std::move(p));
    }
  }
  return procs;
}

// Waits for every rank of an `afd connector-test --bench --bench-rows 1,7 --hidden 16` run
// (fp32 rows) to succeed; returns attention rank 0's bench report, checked to hold both row
// counts with a time.
inline nlohmann::json BenchReportOf(std::vector<RankProcess>& procs) {
  nlohmann::json bench;
  for (auto& p : procs) {
    const std::optional<int> status = p.process->Wait(Deadline::In(60));
    const std::string log = ReadFile(p.log);
    EXPECT_EQ(status, 0) << p.label << " failed:\n" << log;
    if (p.label != "attention 0" || status != 0) continue;
    bench = nlohmann::json::parse(log)["bench"];
    EXPECT_EQ(bench.size(), 2u) << log;
    if (bench.size() != 2u) continue;
    EXPECT_EQ(bench[1]["rows"], 7) << log;
    EXPECT_EQ(bench[1]["bytes_each_way"], 7 * 16 * 4) << log;
    EXPECT_GT(bench[1]["median_us"].get<double>(), 0.0) << log;
  }
  return bench;
}

}  // namespace afd::testing_util

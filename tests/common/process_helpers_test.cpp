// The stop signals of the long-running commands and the private temp folders of their logs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "afd/common/stop_signals.h"
#include "afd/common/temp_dir.h"

namespace afd {
namespace {

TEST(StopSignals, ABlockedSignalIsWaitedForNotDelivered) {
  BlockStopSignals();
  EXPECT_EQ(WaitStopSignal(0), 0);  // none pending
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_EQ(WaitStopSignal(5), SIGTERM);  // the process was not killed: the signal waited
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  EXPECT_EQ(WaitStopSignal(5), SIGINT);
  EXPECT_STREQ(StopSignalName(SIGTERM), "SIGTERM");
  EXPECT_STREQ(StopSignalName(SIGINT), "SIGINT");
}

TEST(StopSignals, WaitEndsAtItsTimeout) {
  BlockStopSignals();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitStopSignal(0.05), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
}

TEST(TempDir, FreshPrivateAndUnpredictable) {
  std::set<std::string> seen;
  for (int i = 0; i < 3; ++i) {
    const std::string dir = MakePrivateTempDir("afd-test-");
    EXPECT_TRUE(seen.insert(dir).second) << dir;
    EXPECT_EQ(dir.find(std::to_string(getpid())), std::string::npos) << dir;
    struct stat st {};
    ASSERT_EQ(stat(dir.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u) << dir;
  }
  for (const auto& d : seen) std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace afd

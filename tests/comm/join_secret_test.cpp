// Where the join secret comes from, and the policy when there is none.
#include "afd/comm/join_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>

#include "afd/common/error.h"

namespace afd::comm {
namespace {

// Restores both variables when the test ends.
struct CleanEnv {
  CleanEnv() {
    unsetenv(kJoinSecretEnv);
    unsetenv(kJoinSecretFileEnv);
  }
  ~CleanEnv() {
    unsetenv(kJoinSecretEnv);
    unsetenv(kJoinSecretFileEnv);
  }
};

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JoinSecret, FromTheEnvironment) {
  CleanEnv env;
  EXPECT_EQ(LoadJoinSecret(), std::nullopt);
  setenv(kJoinSecretEnv, "0123456789abcdef0123", 1);
  EXPECT_EQ(LoadJoinSecret(), "0123456789abcdef0123");
  setenv(kJoinSecretEnv, "short", 1);
  EXPECT_NE(ErrorOf([] { LoadJoinSecret(); }).find("AFD_JOIN_SECRET: the join secret has 5 bytes"),
            std::string::npos);
}

TEST(JoinSecret, FromAFileReadableByItsOwnerOnly) {
  CleanEnv env;
  const std::string path = ::testing::TempDir() + "/afd_secret_" + std::to_string(getpid());
  {
    std::ofstream out(path);
    out << "file-secret-0123456789\n";
  }
  chmod(path.c_str(), 0600);
  setenv(kJoinSecretFileEnv, path.c_str(), 1);
  EXPECT_EQ(LoadJoinSecret(), "file-secret-0123456789");  // trailing newline stripped
  chmod(path.c_str(), 0644);
  std::string e = ErrorOf([] { LoadJoinSecret(); });
  EXPECT_NE(e.find("readable or writable by other users (mode 644)"), std::string::npos) << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
  setenv(kJoinSecretEnv, "0123456789abcdef0123", 1);
  e = ErrorOf([] { LoadJoinSecret(); });
  EXPECT_NE(e.find("both AFD_JOIN_SECRET and AFD_JOIN_SECRET_FILE are set"), std::string::npos);
  unsetenv(kJoinSecretEnv);
  setenv(kJoinSecretFileEnv, "/no/such/secret", 1);
  e = ErrorOf([] { LoadJoinSecret(); });
  EXPECT_NE(e.find("AFD_JOIN_SECRET_FILE=/no/such/secret: cannot read"), std::string::npos) << e;
  unlink(path.c_str());
}

TEST(JoinSecret, NetworkDeploymentsNeedOneLoopbackOnesMayRunWithout) {
  CleanEnv env;
  EXPECT_EQ(ResolveJoinSecret("127.0.0.1"), std::nullopt);
  const std::string e = ErrorOf([] { ResolveJoinSecret("10.0.0.1"); });
  EXPECT_NE(e.find("rendezvous host 10.0.0.1 is not a loopback address"), std::string::npos) << e;
  setenv(kJoinSecretEnv, "0123456789abcdef0123", 1);
  EXPECT_EQ(ResolveJoinSecret("10.0.0.1"), "0123456789abcdef0123");
}

TEST(JoinSecret, LocalLaunchersGenerateOneOnlyWhenNoneIsSet) {
  CleanEnv env;
  EnsureLocalJoinSecret();
  const std::optional<std::string> first = LoadJoinSecret();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->size(), 64u);
  EnsureLocalJoinSecret();
  EXPECT_EQ(LoadJoinSecret(), first);
}

}  // namespace
}  // namespace afd::comm

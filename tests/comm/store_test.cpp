#include "afd/comm/store.h"

#include <gtest/gtest.h>

#include <thread>

#include "afd/common/error.h"

namespace afd::comm {
namespace {

TEST(TcpStore, SetGetAddDeleteCheck) {
  TcpStoreServer server(0);
  TcpStoreClient a("127.0.0.1", server.port(), 5);
  TcpStoreClient b("127.0.0.1", server.port(), 5);
  a.Set("k", "v1");
  EXPECT_EQ(b.TryGet("k"), "v1");
  EXPECT_EQ(b.TryGet("missing"), std::nullopt);
  EXPECT_EQ(a.Add("n", 2), 2);
  EXPECT_EQ(b.Add("n", 3), 5);
  EXPECT_EQ(a.Check({"k", "missing", "n"}), (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(b.Delete("k"));
  EXPECT_FALSE(b.Delete("k"));
  EXPECT_EQ(a.TryGet("k"), std::nullopt);
  // Binary values survive.
  const std::string bin("\0\1\2\xff", 4);
  a.Set("bin", bin);
  EXPECT_EQ(b.TryGet("bin"), bin);
}

TEST(TcpStore, WaitBlocksUntilKeysArriveAndTimesOutNamingMissing) {
  TcpStoreServer server(0);
  TcpStoreClient a("127.0.0.1", server.port(), 5);
  std::thread setter([&] {
    TcpStoreClient b("127.0.0.1", server.port(), 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b.Set("x", "1");
    b.Set("y", "2");
  });
  a.Wait({"x", "y"}, 5);
  EXPECT_EQ(a.Get("y", 1), "2");
  setter.join();
  try {
    a.Wait({"x", "never1", "never2"}, 0.2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never1, never2"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("x,"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, PrefixViewsShareOnePort) {
  TcpStoreServer server(0);
  TcpStoreClient c("127.0.0.1", server.port(), 5);
  PrefixStore g0(c, "afd_subgroup_0"), g1(c, "afd_subgroup_1");
  g0.Set("addr/0", "a");
  g1.Set("addr/0", "b");
  EXPECT_EQ(g0.TryGet("addr/0"), "a");
  EXPECT_EQ(g1.TryGet("addr/0"), "b");
  EXPECT_EQ(c.TryGet("afd_subgroup_1/addr/0"), "b");
  EXPECT_EQ(g1.Check({"addr/0", "addr/1"}), (std::vector<bool>{true, false}));
}

TEST(TcpStore, UnreachableStoreFailsWithinTimeoutNamingAddress) {
  int port;
  {
    TcpStoreServer probe(0);  // find a port that is free once the server is gone
    port = probe.port();
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    TcpStoreClient c("127.0.0.1", port, 0.3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("127.0.0.1:{}", port)), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(TcpStore, TakenPortIsNamed) {
  TcpStoreServer first(0);
  try {
    TcpStoreServer second(first.port());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos);
  }
}

}  // namespace
}  // namespace afd::comm

// The rendezvous store against clients that misbehave: wrong or missing secrets, silence,
// garbage, half-sent frames. Each must be dropped with a log line while the others are served
// without delay.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "afd/comm/socket.h"
#include "afd/comm/store.h"
#include "afd/comm/store_protocol.h"
#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::comm {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kSecret = "0123456789abcdef-test-secret";

// A server whose log lines the test can read.
struct LoggedServer {
  std::mutex mu;
  std::vector<std::string> lines;
  std::unique_ptr<TcpStoreServer> server;

  explicit LoggedServer(std::optional<std::string> secret, double timeouts_s = 0.3) {
    StoreServerOptions o;
    o.secret = std::move(secret);
    o.handshake_timeout_s = o.frame_timeout_s = o.send_timeout_s = timeouts_s;
    o.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
    };
    server = std::make_unique<TcpStoreServer>(std::move(o));
  }
  int port() const { return server->port(); }
  // Waits up to 5 s for a log line containing `text`.
  bool Logged(const std::string& text) {
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < until) {
      {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& l : lines) {
          if (l.find(text) != std::string::npos) return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
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

Socket RawConnect(int port) { return Connect("127.0.0.1", port, Deadline::In(5), "test store"); }

// While `bad` is connected, a well-behaved client's requests take milliseconds.
void ExpectOthersUnaffected(int port, const std::optional<std::string>& secret) {
  const auto start = Clock::now();
  TcpStoreClient good("127.0.0.1", port, 5, secret);
  for (int i = 0; i < 50; ++i) good.Add("counter", 1);
  EXPECT_EQ(good.Add("counter", 0), 50);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

TEST(StoreAuth, MatchingSecretIsAdmitted) {
  LoggedServer s(kSecret);
  TcpStoreClient a("127.0.0.1", s.port(), 5, kSecret);
  a.Set("k", "v");
  EXPECT_EQ(a.TryGet("k"), "v");
}

TEST(StoreAuth, WrongMissingOrUnexpectedSecretIsRefusedAndNamed) {
  LoggedServer s(kSecret);
  std::string e = ErrorOf([&] { TcpStoreClient c("127.0.0.1", s.port(), 5, kSecret + "x"); });
  EXPECT_NE(e.find("rejected this process's join secret"), std::string::npos) << e;
  EXPECT_NE(e.find(fmt::format("127.0.0.1:{}", s.port())), std::string::npos) << e;
  EXPECT_TRUE(s.Logged("failed authentication"));
  e = ErrorOf([&] { TcpStoreClient c("127.0.0.1", s.port(), 5); });
  EXPECT_NE(e.find("requires a join secret and this process has none"), std::string::npos) << e;
  EXPECT_NE(e.find("AFD_JOIN_SECRET"), std::string::npos) << e;

  LoggedServer open(std::nullopt);
  e = ErrorOf([&] { TcpStoreClient c("127.0.0.1", open.port(), 5, kSecret); });
  EXPECT_NE(e.find("runs without a join secret but this process has one"), std::string::npos) << e;
}

TEST(StoreAuth, RequestBeforeAuthenticationIsDroppedWithoutTouchingKeys) {
  LoggedServer s(kSecret);
  Socket raw = RawConnect(s.port());
  const std::string set = store_wire::Frame(store_wire::kSet, {"abort", "forged"});
  raw.SendAll(set.data(), set.size(), Deadline::In(5), "store");
  EXPECT_TRUE(s.Logged("before authenticating"));
  TcpStoreClient good("127.0.0.1", s.port(), 5, kSecret);
  EXPECT_EQ(good.TryGet("abort"), std::nullopt);
}

TEST(StoreAuth, ReplayedAuthenticationFails) {
  // A MAC recorded from one connection is useless on another: the server's nonce differs.
  LoggedServer s(kSecret);
  Socket raw = RawConnect(s.port());
  const std::string client_nonce(32, 'n');
  const std::string stale_mac = store_wire::ClientMac(kSecret, std::string(32, 's'), client_nonce);
  const std::string auth = store_wire::Frame(store_wire::kAuth, {client_nonce, stale_mac});
  raw.SendAll(auth.data(), auth.size(), Deadline::In(5), "store");
  EXPECT_TRUE(s.Logged("failed authentication"));
}

TEST(StoreServer, SilentClientIsDroppedAndCostsOthersNothing) {
  LoggedServer s(kSecret);
  Socket silent = RawConnect(s.port());
  ExpectOthersUnaffected(s.port(), kSecret);
  EXPECT_TRUE(s.Logged("did not authenticate within 0.3s"));
}

TEST(StoreServer, GarbageClientIsDroppedAndCostsOthersNothing) {
  LoggedServer s(std::nullopt);
  Socket garbage = RawConnect(s.port());
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  garbage.SendAll(http.data(), http.size(), Deadline::In(5), "store");
  ExpectOthersUnaffected(s.port(), std::nullopt);
  EXPECT_TRUE(s.Logged("not the store protocol"));
  EXPECT_GE(s.server->num_dropped(), 1);
}

TEST(StoreServer, HalfMessageIsDroppedAndCostsOthersNothing) {
  LoggedServer s(kSecret);
  // Authenticate properly, then send half a SET frame and stall.
  Socket raw = RawConnect(s.port());
  store_wire::FrameHeader h;
  raw.RecvAll(&h, sizeof(h), Deadline::In(5), "store");
  std::string body(h.body_len, '\0');
  raw.RecvAll(body.data(), body.size(), Deadline::In(5), "store");
  std::string server_nonce;
  const std::string auth =
      store_wire::AnswerChallenge(body, kSecret, std::string(32, 'c'), &server_nonce, "store");
  raw.SendAll(auth.data(), auth.size(), Deadline::In(5), "store");
  const std::string set = store_wire::Frame(store_wire::kSet, {"key", std::string(1000, 'v')});
  raw.SendAll(set.data(), set.size() / 2, Deadline::In(5), "store");
  ExpectOthersUnaffected(s.port(), kSecret);
  EXPECT_TRUE(s.Logged("left a frame half-sent"));
}

TEST(StoreServer, ClientThatDoesNotReadItsRepliesIsDroppedAndCostsOthersNothing) {
  LoggedServer s(kSecret);
  TcpStoreClient writer("127.0.0.1", s.port(), 5, kSecret);
  writer.Set("big", std::string(1 << 20, 'v'));
  // Authenticate, then ask for the 1 MiB value 200 times without reading a byte.
  Socket raw = RawConnect(s.port());
  store_wire::FrameHeader h;
  raw.RecvAll(&h, sizeof(h), Deadline::In(5), "store");
  std::string body(h.body_len, '\0');
  raw.RecvAll(body.data(), body.size(), Deadline::In(5), "store");
  std::string server_nonce;
  const std::string auth =
      store_wire::AnswerChallenge(body, kSecret, std::string(32, 'c'), &server_nonce, "store");
  raw.SendAll(auth.data(), auth.size(), Deadline::In(5), "store");
  std::string gets;
  for (int i = 0; i < 200; ++i) gets += store_wire::Frame(store_wire::kGet, {"big"});
  raw.SendAll(gets.data(), gets.size(), Deadline::In(5), "store");
  ExpectOthersUnaffected(s.port(), kSecret);
  EXPECT_TRUE(s.Logged("did not read its replies"));
}

// A client that made no request for longer than the send timeout (a rank loading its weights)
// is served when it asks again: the read deadline of a reply starts when the reply is queued.
TEST(StoreServer, ClientQuietForLongerThanTheSendTimeoutIsServed) {
  LoggedServer s(kSecret, /*timeouts_s=*/0.2);
  TcpStoreClient a("127.0.0.1", s.port(), 5, kSecret);
  a.Set("k", "v");
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.TryGet("k"), std::optional<std::string>("v"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_EQ(s.server->num_dropped(), 0);
}

TEST(StoreServer, OversizedFrameBeforeAuthenticationIsDropped) {
  LoggedServer s(kSecret);
  Socket raw = RawConnect(s.port());
  const store_wire::FrameHeader h{store_wire::kMagic, 60u << 20};
  raw.SendAll(&h, sizeof(h), Deadline::In(5), "store");
  EXPECT_TRUE(s.Logged("exceeds the limit of 256 bytes"));
}

TEST(StoreServer, ManyMisbehavingClientsAtOnce) {
  LoggedServer s(kSecret, 0.5);
  std::vector<Socket> bad;
  for (int i = 0; i < 20; ++i) {
    bad.push_back(RawConnect(s.port()));
    if (i % 2 == 0) bad.back().SendAll("garbage!", 8, Deadline::In(5), "store");
  }
  ExpectOthersUnaffected(s.port(), kSecret);
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (s.server->num_dropped() < 20 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.server->num_dropped(), 20);
}

TEST(StoreServer, ListensOnTheGivenAddressOnly) {
  StoreServerOptions o;
  o.bind_host = "127.0.0.2";  // all of 127/8 is loopback on Linux
  TcpStoreServer server(std::move(o));
  TcpStoreClient ok("127.0.0.2", server.port(), 5);
  const std::string e = ErrorOf([&] { TcpStoreClient other("127.0.0.1", server.port(), 0.3); });
  EXPECT_NE(e.find("could not connect"), std::string::npos) << e;
}

TEST(StoreClient, TricklingStoreCannotOutliveTheDeadline) {
  // A fake store that sends its greeting one byte every 20 ms: the client's 0.3 s bound holds.
  Socket listener = Listen("127.0.0.1", 0);
  const int port = LocalPort(listener);
  std::atomic<bool> stop{false};
  std::thread fake([&] {
    Socket c = Accept(listener, Deadline::In(5), "client");
    const store_wire::FrameHeader h{store_wire::kMagic, 200};
    const std::string greeting =
        std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + std::string(200, 'x');
    for (char ch : greeting) {
      if (stop) break;
      try {
        c.SendAll(&ch, 1, Deadline::In(1), "client");
      } catch (const Error&) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto start = Clock::now();
  const std::string e = ErrorOf([&] { TcpStoreClient c("127.0.0.1", port, 0.3); });
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1500));
  EXPECT_NE(e.find("timed out"), std::string::npos) << e;
  stop = true;
  fake.join();
}

}  // namespace
}  // namespace afd::comm

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace afd::comm {
namespace {

TEST(StoreServer, AcceptFailureEndsTheStoreNamingTheCause) {
  // In a child process with almost no file descriptors left, connections from the parent
  // exhaust them: the store must stop with "accept failed: Too many open files" instead of
  // spinning or exiting silently.
  int to_parent[2];
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    const int probe = dup(0);
    close(probe);
    const rlimit limit{static_cast<rlim_t>(probe + 6), static_cast<rlim_t>(probe + 6)};
    setrlimit(RLIMIT_NOFILE, &limit);
    std::string report = "no failure";
    try {
      StoreServerOptions o;
      o.log = [](const std::string&) {};
      TcpStoreServer server(std::move(o));
      const int port = server.port();
      [[maybe_unused]] ssize_t w = write(to_parent[1], &port, sizeof(port));
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (!server.failure() && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (server.failure()) report = *server.failure();
    } catch (const Error& e) {
      report = std::string("setup: ") + e.what();
    }
    [[maybe_unused]] ssize_t w = write(to_parent[1], report.data(), report.size());
    _exit(0);
  }
  close(to_parent[1]);
  int port = 0;
  ASSERT_EQ(read(to_parent[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  std::vector<Socket> clients;
  for (int i = 0; i < 20; ++i) {
    try {
      clients.push_back(RawConnect(port));
    } catch (const Error&) {
      break;  // the store has stopped listening
    }
  }
  std::string report;
  char buf[512];
  for (ssize_t n; (n = read(to_parent[0], buf, sizeof(buf))) > 0;) report.append(buf, n);
  close(to_parent[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_NE(report.find("accept failed: Too many open files (raise `ulimit -n`)"),
            std::string::npos)
      << report;
}

}  // namespace
}  // namespace afd::comm

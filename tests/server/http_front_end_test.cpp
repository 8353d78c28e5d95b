// The event-driven HTTP front end's bounds, with raw sockets as misbehaving clients would use
// them: slowloris headers, idle sockets, oversized and short bodies, pipelining, a connection
// cap, and more open streams than the old thread-per-request front end had threads.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "server/api_test_util.h"

namespace afd::server::test {
namespace {

using Clock = std::chrono::steady_clock;

// Enough descriptors for the many-connection tests (the soft limit is often 1024).
void RaiseFdLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 1 << 16);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// Everything the server sends until it closes the connection or timeout_s passes.
std::string ReadUntilClosed(int fd, double timeout_s) {
  std::string out;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Reads until `count` HTTP responses with Content-Length bodies have come (or timeout_s).
std::string ReadResponses(int fd, int count, double timeout_s) {
  std::string out;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  auto complete = [&] {
    size_t pos = 0;
    for (int i = 0; i < count; ++i) {
      const size_t head = out.find("\r\n\r\n", pos);
      if (head == std::string::npos) return false;
      const size_t cl = out.find("Content-Length: ", pos);
      if (cl == std::string::npos || cl > head) return false;
      const size_t len = std::stoul(out.substr(cl + 16));
      if (out.size() < head + 4 + len) return false;
      pos = head + 4 + len;
    }
    return true;
  };
  while (!complete() && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Completion(const std::string& body) {
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

bool PollUntilTrue(double timeout_s, const std::function<bool()>& done) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (Clock::now() > deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Slowloris: clients trickling their headers a byte at a time hold no thread and stall nobody;
// each is cut off (408) once its header deadline passes.
TEST(HttpFrontEnd, TricklingHeadersStallNoOneAndAreCutOff) {
  RaiseFdLimit();
  ApiServerOptions o;
  o.header_timeout_s = 1.5;
  ApiHarness h(SmallModel(), o);
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int fd = Connect(h.server->port());
    ASSERT_GE(fd, 0);
    SendAll(fd, "P");
    slow.push_back(fd);
  }
  std::atomic<bool> trickle{true};
  std::thread t([&] {
    const std::string rest = "OST /v1/completions HTTP/1.1\r\nHost: x\r\n";
    for (size_t i = 0; trickle && i < rest.size(); ++i) {
      for (int fd : slow) SendAll(fd, rest.substr(i, 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const auto start = Clock::now();
  EXPECT_EQ(h.Get("/health").status, 200);
  const HttpResult r = h.Post("/v1/completions", json{{"prompt", {5, 6, 7}}, {"max_tokens", 3}});
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_LT(SecondsSince(start), 1.0);  // generous: the event loop answers at once
  // Each trickler gets 408 and a close at its deadline.
  const std::string reply = ReadUntilClosed(slow[0], 5);
  EXPECT_EQ(reply.rfind("HTTP/1.1 408", 0), 0u) << reply;
  EXPECT_NE(reply.find("did not arrive whole within 1.5 s"), std::string::npos) << reply;
  trickle = false;
  t.join();
  for (int fd : slow) close(fd);
}

// Thousands of idle sockets cost a descriptor each, and are closed at the header deadline.
TEST(HttpFrontEnd, IdleSocketsDoNotDelayARequest) {
  RaiseFdLimit();
  ApiHarness h(SmallModel());
  std::vector<int> idle;
  for (int i = 0; i < 2000; ++i) {
    const int fd = Connect(h.server->port());
    if (fd < 0) break;
    idle.push_back(fd);
  }
  EXPECT_GE(idle.size(), 1000u);
  const auto start = Clock::now();
  const HttpResult r = h.Post("/v1/completions", json{{"prompt", {1, 2}}, {"max_tokens", 2}});
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(h.Get("/metrics").status, 200);
  EXPECT_LT(SecondsSince(start), 1.0);
  for (int fd : idle) close(fd);
}

// A body past the limit is refused from its Content-Length (413, before it is read); a body
// shorter than its Content-Length is a 408 naming the bytes that came.
TEST(HttpFrontEnd, BodyLimitAndShortBody) {
  ApiServerOptions o;
  o.max_request_body_bytes = 4096;
  o.body_timeout_s = 1.0;
  ApiHarness h(SmallModel(), o);
  int fd = Connect(h.server->port());
  SendAll(fd,
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          "Content-Length: 52428800\r\n\r\n{\"prompt\": \"");
  std::string reply = ReadUntilClosed(fd, 5);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply;
  EXPECT_NE(reply.find("exceeds the server's limit of 4096 bytes"), std::string::npos) << reply;
  // Through a client too: the 413 body is vLLM's error shape.
  const HttpResult big = h.Post("/v1/completions", std::string(8192, ' '));
  EXPECT_EQ(big.status, 413) << big.raw;
  EXPECT_EQ(big.body["error"]["code"], 413) << big.raw;

  fd = Connect(h.server->port());
  const auto start = Clock::now();
  SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"");
  reply = ReadUntilClosed(fd, 5);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 408", 0), 0u) << reply;
  EXPECT_NE(reply.find("(9 of 100 bytes came)"), std::string::npos) << reply;
  EXPECT_LT(SecondsSince(start), 3.0);
}

// Two requests written at once on one connection are both answered, in order.
TEST(HttpFrontEnd, PipelinedRequestsAreAnsweredInOrder) {
  ApiHarness h(SmallModel());
  const int fd = Connect(h.server->port());
  SendAll(fd, Completion(R"({"prompt": [5, 6, 7], "max_tokens": 2, "return_token_ids": true})") +
                  Completion(R"({"prompt": [8], "max_tokens": 4, "return_token_ids": true})"));
  const std::string replies = ReadResponses(fd, 2, 10);
  close(fd);
  const size_t first = replies.find("\"prompt_token_ids\":[5,6,7]");
  const size_t second = replies.find("\"prompt_token_ids\":[8]");
  ASSERT_NE(first, std::string::npos) << replies;
  ASSERT_NE(second, std::string::npos) << replies;
  EXPECT_LT(first, second);
}

// A client that half-closes its connection while its (non-streamed) request runs is gone, as
// under uvicorn: the request is aborted in the engine and the connection closed (documented in
// docs/server.md); a streamed request keeps writing to a half-closed client.
TEST(HttpFrontEnd, HalfClosedClientIsGone) {
  ApiHarness h(SmallModel());
  const int fd = Connect(h.server->port());
  SendAll(fd, Completion(R"({"prompt": [5], "max_tokens": 200, "ignore_eos": true})"));
  shutdown(fd, SHUT_WR);
  const std::string reply = ReadUntilClosed(fd, 10);
  close(fd);
  EXPECT_EQ(reply.find("HTTP/1.1 200"), std::string::npos) << reply;
  EXPECT_TRUE(PollUntilTrue(5, [&] { return !h.engine.aborted().empty(); }));

  const int sfd = Connect(h.server->port());
  SendAll(sfd, Completion(R"({"prompt": [5], "max_tokens": 5, "stream": true})"));
  shutdown(sfd, SHUT_WR);
  const std::string streamed = ReadUntilClosed(sfd, 10);
  close(sfd);
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << streamed;
}

// HTTP/1.0 has no chunked encoding: a stream to a 1.0 client is its bytes, ended by the close.
TEST(HttpFrontEnd, StreamToAnHttp10ClientIsNotChunked) {
  ApiHarness h(SmallModel());
  const int fd = Connect(h.server->port());
  const std::string body = R"({"prompt": [5], "max_tokens": 3, "stream": true})";
  SendAll(fd,
          "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
          "Content-Length: " +
              std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string reply = ReadUntilClosed(fd, 10);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.0 200", 0), 0u) << reply;
  EXPECT_EQ(reply.find("chunked"), std::string::npos) << reply;
  const size_t head_end = reply.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << reply;
  EXPECT_EQ(reply.substr(head_end + 4).rfind("data: ", 0), 0u) << reply;  // no chunk sizes
  EXPECT_NE(reply.find("data: [DONE]\n\n"), std::string::npos) << reply;
}

// Past max_connections a connection is answered 503 and closed; the open ones still work.
TEST(HttpFrontEnd, ConnectionCapAnswers503) {
  ApiServerOptions o;
  o.max_connections = 20;
  ApiHarness h(SmallModel(), o);
  std::vector<int> held;
  for (int i = 0; i < 20; ++i) held.push_back(Connect(h.server->port()));
  // Let the server accept them before the next one.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int extra = Connect(h.server->port());
  const std::string reply = ReadUntilClosed(extra, 5);
  close(extra);
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
  EXPECT_NE(reply.find("Retry-After"), std::string::npos) << reply;
  SendAll(held[0], Completion(R"({"prompt": [1], "max_tokens": 1})"));
  EXPECT_NE(ReadResponses(held[0], 1, 5).find("HTTP/1.1 200"), std::string::npos);
  for (int fd : held) close(fd);
}

// More open streams than the old front end's 128 threads, all answered to the end.
TEST(HttpFrontEnd, HundredsOfConcurrentStreamsComplete) {
  RaiseFdLimit();
  ApiHarness h(SmallModel());
  constexpr int kStreams = 400;
  std::vector<int> fds;
  const std::string body = R"({"prompt": [3, 4], "max_tokens": 20, "stream": true})";
  for (int i = 0; i < kStreams; ++i) {
    const int fd = Connect(h.server->port());
    ASSERT_GE(fd, 0);
    SendAll(fd, Completion(body));
    fds.push_back(fd);
  }
  int done = 0;
  for (int fd : fds) {
    std::string reply;
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    char buf[4096];
    while (reply.find("data: [DONE]") == std::string::npos && Clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
    if (reply.find("data: [DONE]") != std::string::npos) ++done;
    close(fd);
  }
  EXPECT_EQ(done, kStreams);
}

}  // namespace
}  // namespace afd::server::test

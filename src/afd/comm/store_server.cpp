// TcpStoreServer: the rendezvous store's poll loop (store.h, protocol in store_protocol.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>

#include "afd/comm/store.h"
#include "afd/comm/store_protocol.h"
#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::comm {

using namespace store_wire;

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxPendingOut = 4u << 20;  // stop reading a client whose replies pile up

std::string PeerName(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf));
  return fmt::format("{}:{}", buf, ntohs(addr.sin_port));
}

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Accept errors a busy or hostile network causes; anything else ends the server.
bool TransientAcceptError(int err) {
  return err == EINTR || err == ECONNABORTED || err == EPROTO || err == EPERM || err == ENETDOWN ||
         err == ENOPROTOOPT || err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH ||
         err == EOPNOTSUPP || err == ENETUNREACH;
}

}  // namespace

namespace {
StoreServerOptions LoopbackOptions(int port) {
  StoreServerOptions o;
  o.port = port;
  return o;
}
}  // namespace

TcpStoreServer::TcpStoreServer(int port) : TcpStoreServer(LoopbackOptions(port)) {}

TcpStoreServer::TcpStoreServer(StoreServerOptions options) : options_(std::move(options)) {
  listener_ = Listen(options_.bind_host, options_.port);
  port_ = LocalPort(listener_);
  AFD_CHECK(pipe2(wake_fd_, O_CLOEXEC) == 0, "pipe failed: {}", std::strerror(errno));
  thread_ = std::thread([this] { Serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  if (wake_fd_[1] >= 0) {
    const char c = 'x';
    [[maybe_unused]] ssize_t n = write(wake_fd_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : wake_fd_) {
    if (fd >= 0) close(fd);
  }
}

std::optional<std::string> TcpStoreServer::failure() const {
  MutexLock lock(failure_mu_);
  return failure_;
}

void TcpStoreServer::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "afd store: %s\n", line.c_str());
  }
}

void TcpStoreServer::Serve() {
  struct Client {
    Socket socket;
    std::string peer;
    std::unique_ptr<StoreSession> session;
    std::string in, out;
    Clock::time_point connected;
    Clock::time_point partial_since;  // meaningful while `in` is not empty
    Clock::time_point blocked_since;  // meaningful while `out` is not empty
    std::string drop_reason;          // set: drop after one last attempt to send `out`
  };
  StoreData data;
  std::list<Client> clients;
  const auto handshake = Seconds(options_.handshake_timeout_s);
  const auto frame = Seconds(options_.frame_timeout_s);
  const auto send = Seconds(options_.send_timeout_s);
  auto fail = [&](const std::string& why) {
    {
      MutexLock lock(failure_mu_);
      failure_ = why;
    }
    Log("FATAL: " + why + "; the store stops serving and every rank loses it");
  };
  auto consume = [](Client& c) {
    const size_t before = c.in.size();
    const bool had_out = !c.out.empty();
    try {
      c.session->Consume(c.in, c.out, kMaxPendingOut);
    } catch (const Error& e) {
      c.drop_reason = e.what();
    }
    // Frames held back while replies piled up are the server's delay, not the client's.
    if (c.in.size() != before) c.partial_since = Clock::now();
    // A reply to a client that had none pending: its read deadline starts now, not at the
    // last reply it read (a client quiet for longer than the send timeout, e.g. loading
    // weights, was dropped with its first new reply).
    if (!had_out && !c.out.empty()) c.blocked_since = Clock::now();
  };

  while (true) {
    const Clock::time_point now = Clock::now();
    // Earliest client deadline bounds the poll, so timeouts fire without traffic.
    Clock::time_point wake_at = now + std::chrono::seconds(1);
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (Client& c : clients) {
      short events = 0;
      if (c.out.size() < kMaxPendingOut) events |= POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({c.socket.fd(), events, 0});
      if (!c.session->authenticated()) wake_at = std::min(wake_at, c.connected + handshake);
      if (!c.in.empty() && c.out.empty()) wake_at = std::min(wake_at, c.partial_since + frame);
      if (!c.out.empty()) wake_at = std::min(wake_at, c.blocked_since + send);
    }
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake_at - now);
    const int rc = poll(fds.data(), fds.size(), std::max<int>(0, wait_ms.count() + 1));
    if (rc < 0) {
      if (errno == EINTR) continue;
      fail(fmt::format("poll failed: {}", std::strerror(errno)));
      break;
    }
    if (fds[0].revents) break;
    if (fds[1].revents & (POLLERR | POLLNVAL)) {
      fail("the listening socket reported an error");
      break;
    }
    // Per-client work first: fds[2 + i] belongs to the i-th client as polled.
    size_t i = 2;
    for (Client& c : clients) {
      const short rev = fds[i++].revents;
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        try {
          char buf[65536];
          const size_t n = c.socket.RecvSome(buf, sizeof(buf), "store client " + c.peer);
          if (n > 0 && c.in.empty()) c.partial_since = Clock::now();
          c.in.append(buf, n);
          consume(c);
        } catch (const Error&) {
          if (!c.session->authenticated()) {
            c.drop_reason = "closed the connection before authenticating";
          } else if (!c.in.empty()) {
            c.drop_reason = fmt::format(
                "closed the connection in the middle of a frame ({} bytes "
                "of it sent)",
                c.in.size());
          } else {
            c.socket.Close();  // an ordinary hang-up
            continue;
          }
        }
        if (c.in.empty()) c.partial_since = Clock::time_point();
      }
      if ((rev & POLLOUT) && !c.out.empty()) {
        try {
          const size_t n = c.socket.SendSome(c.out.data(), c.out.size(), "store client " + c.peer);
          if (n > 0) {
            c.out.erase(0, n);
            c.blocked_since = Clock::now();
            if (c.drop_reason.empty()) consume(c);  // frames held back while replies piled up
          }
        } catch (const Error& e) {
          if (c.drop_reason.empty()) c.drop_reason = e.what();
        }
      }
    }
    // Deadlines and drops.
    const Clock::time_point later = Clock::now();
    for (Client& c : clients) {
      if (!c.socket.valid()) continue;
      if (c.drop_reason.empty()) {
        if (!c.session->authenticated() && later >= c.connected + handshake) {
          c.drop_reason = fmt::format("did not authenticate within {}s of connecting",
                                      options_.handshake_timeout_s);
        } else if (!c.in.empty() && c.out.empty() && later >= c.partial_since + frame) {
          c.drop_reason = fmt::format("left a frame half-sent ({} bytes) for {}s", c.in.size(),
                                      options_.frame_timeout_s);
        } else if (!c.out.empty() && later >= c.blocked_since + send) {
          c.drop_reason = fmt::format("did not read its replies ({} bytes pending) for {}s",
                                      c.out.size(), options_.send_timeout_s);
        }
      }
      if (!c.drop_reason.empty()) {
        try {  // e.g. AUTH_FAILED: worth one attempt, never a wait
          if (!c.out.empty()) c.socket.SendSome(c.out.data(), c.out.size(), c.peer);
        } catch (const Error&) {
        }
        Log(fmt::format("dropped client {}: {}", c.peer, c.drop_reason));
        ++num_dropped_;
        c.socket.Close();
      }
    }
    clients.remove_if([](const Client& c) { return !c.socket.valid(); });
    // New connections.
    if (fds[1].revents & POLLIN) {
      bool fatal = false;
      while (true) {
        const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (TransientAcceptError(errno)) continue;
          fail(fmt::format("accept failed: {}{}", std::strerror(errno),
                           errno == EMFILE || errno == ENFILE ? " (raise `ulimit -n`)" : ""));
          fatal = true;
          break;
        }
        ConfigureStream(fd);
        Client c;
        c.socket = Socket(fd);
        c.peer = PeerName(fd);
        ++num_accepted_;
        if (static_cast<int>(clients.size()) >= options_.max_clients) {
          Log(fmt::format("refused client {}: {} clients are connected already", c.peer,
                          clients.size()));
          ++num_dropped_;
          continue;
        }
        c.session = std::make_unique<StoreSession>(data, options_.secret, RandomBytes(kNonceBytes));
        c.out = c.session->Greeting();
        c.connected = c.blocked_since = Clock::now();
        clients.push_back(std::move(c));
      }
      if (fatal) break;
    }
    num_clients_.store(static_cast<int>(clients.size()));
  }
  clients.clear();  // every client fails fast instead of waiting for its timeout
  num_clients_.store(0);
}

}  // namespace afd::comm

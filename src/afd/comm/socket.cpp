#include "afd/comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "afd/common/error.h"

namespace afd::comm {

namespace {

std::string Errno() { return std::strerror(errno); }

sockaddr_in MakeAddr(const std::string& ipv4, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  AFD_CHECK(inet_pton(AF_INET, ipv4.c_str(), &addr.sin_addr) == 1, "'{}' is not an IPv4 address",
            ipv4);
  return addr;
}

// Waits until fd is ready for `events` or the deadline passes. Returns false on timeout.
bool WaitFor(int fd, short events, const Deadline& deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, deadline.remaining_ms());
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) AFD_THROW("poll failed: {}", Errno());
  }
}

// A TCP connect to a local port in the ephemeral range that nobody listens on can connect the
// socket to itself (simultaneous open); such a socket would read back its own requests.
bool IsSelfConnected(int fd) {
  sockaddr_in local{}, peer{};
  socklen_t a = sizeof(local), b = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &a) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) != 0) {
    return false;
  }
  return local.sin_port == peer.sin_port && local.sin_addr.s_addr == peer.sin_addr.s_addr;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.Release();
  }
  return *this;
}

int Socket::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

size_t Socket::SendSome(const void* data, size_t bytes, const std::string& what) {
  while (true) {
    const ssize_t n = ::send(fd_, data, bytes, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    AFD_THROW("lost connection to {} while sending: {}", what, Errno());
  }
}

size_t Socket::RecvSome(void* data, size_t bytes, const std::string& what) {
  if (bytes == 0) return 0;
  while (true) {
    const ssize_t n = ::recv(fd_, data, bytes, 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) AFD_THROW("{} closed the connection (process exited or shut down)", what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    AFD_THROW("lost connection to {} while receiving: {}", what, Errno());
  }
}

void Socket::SendAll(const void* data, size_t bytes, const Deadline& deadline,
                     const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t n = SendSome(p, bytes, what);
    p += n;
    bytes -= n;
    // The deadline is checked after every chunk, so a peer that drains a byte at a time cannot
    // keep the operation alive past it.
    if (bytes > 0 && (deadline.expired() || (n == 0 && !WaitFor(fd_, POLLOUT, deadline)))) {
      AFD_THROW("timed out sending to {} ({} bytes still unsent)", what, bytes);
    }
  }
}

void Socket::RecvAll(void* data, size_t bytes, const Deadline& deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const size_t n = RecvSome(p, bytes, what);
    p += n;
    bytes -= n;
    // Checked after every chunk: a peer that trickles bytes cannot outlive the deadline.
    if (bytes > 0 && (deadline.expired() || (n == 0 && !WaitFor(fd_, POLLIN, deadline)))) {
      AFD_THROW("timed out waiting for {} ({} bytes still missing)", what, bytes);
    }
  }
}

void ConfigureStream(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // Notice a vanished host within about a minute instead of hours.
  int idle = 20, interval = 5, count = 6;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

Socket Listen(const std::string& bind_host, int port, int backlog) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  AFD_CHECK(s.valid(), "socket() failed: {}", Errno());
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const std::string ip = bind_host.empty() ? "0.0.0.0" : bind_host;
  sockaddr_in addr = MakeAddr(ip, port);
  AFD_CHECK(::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0,
            "cannot listen on {}:{}: {}", ip, port, Errno());
  AFD_CHECK(::listen(s.fd(), backlog) == 0, "listen on {}:{} failed: {}", ip, port, Errno());
  const int flags = fcntl(s.fd(), F_GETFL, 0);
  fcntl(s.fd(), F_SETFL, flags | O_NONBLOCK);
  return s;
}

int LocalPort(const Socket& listener) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  AFD_CHECK(getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0,
            "getsockname failed: {}", Errno());
  return ntohs(addr.sin_port);
}

Socket Accept(const Socket& listener, const Deadline& deadline, const std::string& what) {
  while (true) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      ConfigureStream(fd);
      return Socket(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) AFD_THROW("accept failed: {}", Errno());
    if (!WaitFor(listener.fd(), POLLIN, deadline)) {
      AFD_THROW("timed out waiting for {} to connect", what);
    }
  }
}

Socket Connect(const std::string& host, int port, const Deadline& deadline,
               const std::string& what) {
  std::string last_error = "no attempt made";
  int backoff_ms = 10;
  while (true) {
    try {
      const sockaddr_in addr = MakeAddr(ResolveIPv4(host), port);
      Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      AFD_CHECK(s.valid(), "socket() failed: {}", Errno());
      ConfigureStream(s.fd());
      const int rc = ::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
      if (rc == 0 && !IsSelfConnected(s.fd())) return s;
      if (rc == 0) {
        last_error = "connected to itself (nobody listening yet)";
      } else if (errno == EINPROGRESS) {
        if (WaitFor(s.fd(), POLLOUT, deadline)) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
          if (err == 0 && !IsSelfConnected(s.fd())) return s;
          last_error = err == 0 ? "connected to itself (nobody listening yet)"
                                : std::string(std::strerror(err));
        } else {
          last_error = "connect timed out";
        }
      } else {
        last_error = Errno();
      }
    } catch (const Error& e) {
      last_error = e.what();
    }
    if (deadline.expired()) {
      AFD_THROW("could not connect to {} at {}:{} before the timeout: {}", what, host, port,
                last_error);
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(backoff_ms, std::max(1, deadline.remaining_ms()))));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
}

int PickRendezvousPort() {
  int lo = 32768, hi = 60999;  // the kernel's default ephemeral range
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int l = 0, h = 0;
  if (range >> l >> h && l >= 1 && h >= l && h <= 65535) {
    lo = l;
    hi = h;
  }
  // Below the range when there is room there, else above it.
  int first = std::max(1024, lo / 2), span = lo - first;
  if (span < 1024) {
    first = hi + 1;
    span = 65536 - first;
  }
  AFD_CHECK(span >= 16, "the ephemeral port range {}..{} leaves no room for a rendezvous port", lo,
            hi);
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = first + static_cast<int>(rng() % static_cast<unsigned>(span));
    try {
      Socket probe = Listen("", port);
      return port;
    } catch (const Error&) {
      // taken: try another
    }
  }
  AFD_THROW("no free port found in {}..{} for the rendezvous store", first, first + span - 1);
}

std::string ResolveIPv4(const std::string& host) {
  in_addr direct{};
  if (inet_pton(AF_INET, host.c_str(), &direct) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  AFD_CHECK(rc == 0 && res != nullptr, "cannot resolve host '{}': {}", host, gai_strerror(rc));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return buf;
}

std::string LocalAddressToward(const std::string& host, int port) {
  const sockaddr_in addr = MakeAddr(ResolveIPv4(host), port);
  Socket s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  AFD_CHECK(s.valid(), "socket() failed: {}", Errno());
  // A UDP connect only selects the route and source address; nothing goes on the wire.
  AFD_CHECK(::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0,
            "no route from this host toward {}:{}: {}", host, port, Errno());
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  AFD_CHECK(getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &len) == 0,
            "getsockname failed: {}", Errno());
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
  return buf;
}

}  // namespace afd::comm

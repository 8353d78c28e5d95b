// Thin RAII wrappers over POSIX TCP sockets with deadlines. Every blocking call takes a
// Deadline and throws afd::Error naming `what` (the peer) on timeout, reset or EOF.
//
// Thread safety: a Socket is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "afd/common/deadline.h"

namespace afd::comm {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { Close(); }
  Socket(Socket&& other) noexcept : fd_(other.Release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();
  void Close();

  // Writes / reads exactly `bytes` or throws. `what` names the peer in messages.
  void SendAll(const void* data, size_t bytes, const Deadline& deadline, const std::string& what);
  void RecvAll(void* data, size_t bytes, const Deadline& deadline, const std::string& what);
  // Non-blocking progress for the poll loops: returns bytes moved (0 if it would block);
  // throws on error or EOF.
  size_t SendSome(const void* data, size_t bytes, const std::string& what);
  size_t RecvSome(void* data, size_t bytes, const std::string& what);

 private:
  int fd_ = -1;
};

// Listens on `bind_host` (an IPv4 address, "" or "0.0.0.0" for any) at `port` (0: ephemeral).
// Throws afd::Error naming the address when bind fails (e.g. port taken).
Socket Listen(const std::string& bind_host, int port, int backlog = 128);
// Port a listening socket is bound to.
int LocalPort(const Socket& listener);
// Accepts one connection, waiting until the deadline. Throws on timeout naming `what`.
Socket Accept(const Socket& listener, const Deadline& deadline, const std::string& what);
// Connects to host:port, retrying refused/unreachable attempts until the deadline (the peer may
// not be listening yet). Throws on timeout naming `what`.
Socket Connect(const std::string& host, int port, const Deadline& deadline,
               const std::string& what);

// The IPv4 address of this host's interface that routes toward `host` (multi-host rendezvous):
// connects a UDP socket, which picks a route without sending a packet. 127.0.0.1 stays 127.0.0.1.
std::string LocalAddressToward(const std::string& host, int port);

// Resolves a host name or dotted address to a dotted IPv4 address. Throws naming the host.
std::string ResolveIPv4(const std::string& host);

// A port for a rendezvous store that is free now, chosen at random below the kernel's
// ephemeral range (ip_local_port_range), where the ports that connections and `bind(0)` take
// come from -- so, unlike a released ephemeral port, nothing else on this host grabs it before
// the store binds it, short of an explicit bind. Throws afd::Error if none is found.
int PickRendezvousPort();

// Sets non-blocking mode, TCP_NODELAY and keepalive (so a vanished host is noticed).
void ConfigureStream(int fd);

}  // namespace afd::comm

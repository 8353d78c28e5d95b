// Rendezvous key-value store. World rank 0 (the first FFN rank) serves it at the configured
// host:port (TcpStoreServer); every rank, including rank 0, talks to it through a
// TcpStoreClient. PrefixStore gives each group (subgroups, control plane, join) its own key
// space on the one port. Wire format: docs/wire_formats.md ("Rendezvous store").
//
// Thread safety: TcpStoreClient and PrefixStore may be called from several threads (requests are
// serialized). TcpStoreServer runs its own thread; its accessors may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "afd/comm/socket.h"
#include "afd/common/thread_annotations.h"

namespace afd::comm {

class Store {
 public:
  virtual ~Store() = default;

  virtual void Set(const std::string& key, const std::string& value) = 0;
  // The value if the key exists now (does not wait).
  virtual std::optional<std::string> TryGet(const std::string& key) = 0;
  // Adds delta to the integer stored at key (missing = 0) and returns the new value.
  virtual int64_t Add(const std::string& key, int64_t delta) = 0;
  // Removes the key; returns whether it existed.
  virtual bool Delete(const std::string& key) = 0;
  // For each key, whether it exists now.
  virtual std::vector<bool> Check(const std::vector<std::string>& keys) = 0;

  // Waits until every key exists. Throws afd::Error listing the keys still missing at timeout.
  void Wait(const std::vector<std::string>& keys, double timeout_s);
  // Waits for the key, then returns its value. Throws afd::Error naming it at timeout.
  std::string Get(const std::string& key, double timeout_s);
};

// Keys of `base` under "<prefix>/". Does not own base, which must outlive it.
class PrefixStore : public Store {
 public:
  PrefixStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix) + "/") {}
  void Set(const std::string& key, const std::string& value) override;
  std::optional<std::string> TryGet(const std::string& key) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  bool Delete(const std::string& key) override;
  std::vector<bool> Check(const std::vector<std::string>& keys) override;

 private:
  Store& base_;
  std::string prefix_;
};

class TcpStoreClient : public Store {
 public:
  // Connects to host:port, retrying until timeout_s (the server may start later), and
  // authenticates with `secret` (docs/reliability.md; nullopt for a store without one). Every
  // request is bounded by timeout_s, checked on every byte. Throws afd::Error naming the address
  // when the store is unreachable or the secrets do not match.
  TcpStoreClient(const std::string& host, int port, double timeout_s,
                 std::optional<std::string> secret = std::nullopt);

  void Set(const std::string& key, const std::string& value) override;
  std::optional<std::string> TryGet(const std::string& key) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  bool Delete(const std::string& key) override;
  std::vector<bool> Check(const std::vector<std::string>& keys) override;

 private:
  // Sends one request frame and returns the response payload.
  std::string Request(uint8_t op, const std::vector<std::string>& fields);
  // Reads one frame body (unlocked helper of Request and the handshake).
  std::string ReadFrame(const Deadline& deadline, uint32_t max_body) AFD_REQUIRES(mu_);

  std::string where_;  // "rendezvous store at host:port (served by ...)": errors name who serves it
  double timeout_s_;
  Mutex mu_;
  Socket socket_ AFD_GUARDED_BY(mu_);
};

struct StoreServerOptions {
  std::string bind_host = "127.0.0.1";  // an IPv4 address of this host ("0.0.0.0": every one)
  int port = 0;                         // 0: an ephemeral port
  std::optional<std::string> secret;    // join secret; nullopt: any client may authenticate
  // A client is dropped (with a log line) when it has not authenticated this long after
  // connecting, leaves a frame half-sent this long, or does not read its replies this long.
  double handshake_timeout_s = 10;
  double frame_timeout_s = 10;
  double send_timeout_s = 10;
  int max_clients = 4096;  // connections beyond this are closed at once
  // Where log lines go; default: stderr, prefixed "afd store: ".
  std::function<void(const std::string&)> log;
};

class TcpStoreServer {
 public:
  // Listens on options.bind_host:options.port and serves until destroyed: one thread, a poll
  // loop over non-blocking connections with their own buffers, so a stalled, silent or
  // garbage-sending client costs the others nothing. Throws afd::Error naming the address when
  // it cannot listen (e.g. taken).
  explicit TcpStoreServer(StoreServerOptions options);
  // Loopback, ephemeral or given port, no secret (tests).
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Clients connected right now.
  int num_clients() const { return num_clients_.load(); }
  // Connections accepted since the server started.
  int num_accepted() const { return num_accepted_.load(); }
  // Clients dropped for misbehaving (garbage, timeouts, failed authentication).
  int num_dropped() const { return num_dropped_.load(); }
  // Why the server stopped serving (a poll or accept error), or nullopt while it serves. Every
  // client loses its connection at that point.
  std::optional<std::string> failure() const;

 private:
  void Serve();
  void Log(const std::string& line) const;

  StoreServerOptions options_;
  Socket listener_;
  int port_;
  int wake_fd_[2] = {-1, -1};  // pipe that stops the serving thread
  std::thread thread_;
  std::atomic<int> num_clients_{0};
  std::atomic<int> num_accepted_{0};
  std::atomic<int> num_dropped_{0};
  mutable Mutex failure_mu_;
  std::optional<std::string> failure_ AFD_GUARDED_BY(failure_mu_);
};

}  // namespace afd::comm

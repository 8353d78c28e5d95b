// Rendezvous key-value store. World rank 0 (the first FFN rank) serves it at the configured
// host:port (TcpStoreServer); every rank, including rank 0, talks to it through a
// TcpStoreClient. PrefixStore gives each group (subgroups, control plane, join) its own key
// space on the one port. Wire format: docs/wire_formats.md ("Rendezvous store").
//
// Thread safety: TcpStoreClient and PrefixStore may be called from several threads (requests are
// serialized). TcpStoreServer runs its own thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "afd/comm/socket.h"

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
  // Connects to host:port, retrying until timeout_s (the server may start later). Every request
  // is bounded by timeout_s. Throws afd::Error naming the address when the store is unreachable.
  TcpStoreClient(const std::string& host, int port, double timeout_s);

  void Set(const std::string& key, const std::string& value) override;
  std::optional<std::string> TryGet(const std::string& key) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  bool Delete(const std::string& key) override;
  std::vector<bool> Check(const std::vector<std::string>& keys) override;

 private:
  // Sends one request frame and returns the response payload.
  std::string Request(uint8_t op, const std::vector<std::string>& fields);

  std::string where_;  // "rendezvous store at host:port"
  double timeout_s_;
  std::mutex mu_;
  Socket socket_;  // GUARDED_BY(mu_)
};

class TcpStoreServer {
 public:
  // Listens on all interfaces at `port` and serves until destroyed. Throws afd::Error naming the
  // port when it cannot listen (e.g. taken).
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Clients connected right now.
  int num_clients() const { return num_clients_.load(); }
  // Connections accepted since the server started.
  int num_accepted() const { return num_accepted_.load(); }

 private:
  void Serve();

  Socket listener_;
  int port_;
  int wake_fd_[2] = {-1, -1};  // pipe that stops the serving thread
  std::thread thread_;
  std::atomic<int> num_clients_{0};
  std::atomic<int> num_accepted_{0};
};

}  // namespace afd::comm

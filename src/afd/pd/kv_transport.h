// KV transfers over TCP (prefill/decode disaggregation, docs/pd.md): a prefill instance serves
// the cache rows its engine holds (KvTransferServer), a decode instance pulls them
// (FetchKvRows). Every connection authenticates both ways with the deployment's join secret (the
// rendezvous store's challenge-response, other labels); the consumer states the model it serves
// and the cache layout it expects, and any mismatch fails the fetch naming both sides. Rows are
// released on the producer only once the consumer confirmed it received them. Every wait has a
// deadline. Wire format: docs/wire_formats.md ("KV transfer").
// Thread safety: a server runs its own threads (the callbacks run on them); FetchKvRows may be
// called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "afd/comm/socket.h"
#include "afd/common/thread_annotations.h"
#include "afd/model/model.h"
#include "afd/runtime/request.h"

namespace afd::pd {

class KvTransferServer {
 public:
  // The held rows of a request (throws afd::Error with the reason when it holds none), and
  // their release after the consumer received them. Both run on the server's threads.
  // device_ok: the consumer shares this host (KvHostId) and reads rows left in a GPU cache
  // over CUDA IPC: Provide may describe them (runtime::KvRows::device) rather than copy them; the
  // consumer then releases them itself once copied (ReleaseKvRows).
  using Provide =
      std::function<std::shared_ptr<const runtime::KvRows>(uint64_t request_id, bool device_ok)>;
  using Release = std::function<void(uint64_t request_id)>;
  // Listens on bind_host:port (0: a free port); secret: nullopt accepts any client (loopback
  // tests); model: this instance's fingerprint. io_timeout_s bounds every read and write of a
  // connection (a stalled client costs one connection thread that long); at most
  // kMaxConnections are served at once (more get an error reply).
  static constexpr int kMaxConnections = 32;
  KvTransferServer(const std::string& bind_host, int port, std::optional<std::string> secret,
                   std::string model, Provide provide, Release release, double io_timeout_s);
  ~KvTransferServer();  // stops accepting and joins every connection thread
  KvTransferServer(const KvTransferServer&) = delete;
  KvTransferServer& operator=(const KvTransferServer&) = delete;

  int port() const { return port_; }
  int64_t transfers_done() const { return transfers_done_.load(); }
  int64_t device_transfers() const { return device_transfers_.load(); }  // of them, by CUDA IPC

 private:
  void AcceptLoop();
  void Serve(comm::Socket s);

  std::optional<std::string> secret_;
  std::string model_;
  Provide provide_;
  Release release_;
  double io_timeout_s_;
  comm::Socket listener_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> transfers_done_{0};
  std::atomic<int64_t> device_transfers_{0};
  Mutex mu_;
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::list<Connection> connections_ AFD_GUARDED_BY(mu_);
  std::thread acceptor_;
};

// What the two sides of a transfer compare: the model's type and shapes and its cache rows'
// layout (two checkpoints of the same shapes are not told apart).
std::string KvModelFingerprint(const model::MoeModel& model);

// This host's identity for the KV transport (its boot id and host name): a producer offers
// rows over CUDA IPC only to a consumer that names the same.
const std::string& KvHostId();

// Pulls the rows request `request_id` holds on the producer at host:port, checking them against
// `expect`; then tells the producer to release them. accept_device: a consumer whose engines
// can read another process's GPU memory (CUDA IPC) takes rows the producer left in its GPU
// cache as a description (runtime::KvRows::device) when both share this host; those stay held until
// ReleaseKvRows (runtime::KvReleaseToken). Throws afd::Error naming the producer and the cause
// (unreachable, wrong secret, another model or layout, unknown request, timeout) within
// timeout_s.
runtime::KvRows FetchKvRows(const std::string& host, int port, uint64_t request_id,
                            const runtime::KvLayout& expect,
                            const std::optional<std::string>& secret, double timeout_s,
                            bool accept_device = false);

// Tells the producer to free request `request_id`'s rows without pulling them (the decode leg
// will not come: `afd proxy` when no decoder took it). Unknown or released ids are no error.
// Throws afd::Error naming the producer when it cannot be reached or refuses the secret.
void ReleaseKvRows(const std::string& host, int port, uint64_t request_id,
                   const std::optional<std::string>& secret, double timeout_s);

}  // namespace afd::pd

// An EngineClient over the attention data-parallel replicas of a deployment, each a worker
// process running deploy::ServeReplica: it listens (127.0.0.1 and an ephemeral port by default,
// passed to the workers as --engine-endpoint; or the --data-parallel-address and
// --data-parallel-rpc-port that headless hosts' replicas connect to), waits for one
// authenticated connection and hello per replica, sends each
// request to the replica with the fewest live requests (ties: the lowest DP rank), and runs one
// I/O thread that reads every replica's step frames and calls the requests' callbacks. A lost
// replica connection, or SetFailure (the launcher saw a process die), ends every live request
// with an error output and makes Failure() say why. KV transfers: a request with hold_kv_s > 0
// is remembered with its replica; ExportHeldKv asks that replica for the rows (export_kv, its
// answer kv_rows read by the I/O thread), ReleaseHeldKv tells it to free them; imported rows
// travel in the submit frame.
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "afd/comm/socket.h"
#include "afd/common/thread_annotations.h"
#include "afd/deploy/engine_wire.h"
#include "afd/server/engine_client.h"

namespace afd::server {

// Where the engine listener binds, and the join secret replicas must prove.
struct EngineListenOptions {
  std::string host = "127.0.0.1";  // an IPv4 address; "0.0.0.0": every interface
  int port = 0;                    // 0: an ephemeral port
  // The join secret replicas prove; nullopt: none (ServeReplicas allows that on loopback only).
  std::optional<std::string> secret;
};

class ReplicaEngineClient : public EngineClient {
 public:
  // Starts listening and the I/O thread; `num_replicas` DP replicas (ranks 0..n-1 of this
  // deployment's share: hellos carry dp_rank, numbered from `first_dp_rank`), on this host or
  // others (headless hosts' replicas connect to `listen`). Every connection is first sent a
  // challenge; a hello that does not prove the secret is refused and dropped with a log line
  // (never failing the deployment), as is a connection that says nothing within 30 s.
  ReplicaEngineClient(int num_replicas, int first_dp_rank, EngineListenOptions listen = {});
  ~ReplicaEngineClient() override;

  // host:port for replicas on this host ("127.0.0.1:port" when bound to every interface).
  std::string endpoint() const { return endpoint_; }
  // Blocks until every replica said hello (true), Failure() is set, or timeout_s passed
  // (false; Failure() then says which replicas are missing).
  bool WaitReady(double timeout_s);
  // Asks every replica to finish its work and leave (the deployment then ends).
  void Shutdown();
  // Records a failure seen elsewhere (a dead process); live requests get error outputs.
  void SetFailure(const std::string& why);
  int64_t num_live() const;

  const EngineModelInfo& model_info() const override;
  void Submit(uint64_t id, runtime::RequestParams params, OutputCallback on_output) override;
  void Abort(uint64_t id) override;
  EngineLoad Load() const override;
  bool Ready() const override;
  std::string Failure() const override;
  bool SupportsKvTransfer() const override { return true; }
  std::shared_ptr<const runtime::KvRows> ExportHeldKv(uint64_t id, double timeout_s,
                                                      bool device_ok = false) override;
  void ReleaseHeldKv(uint64_t id) override;
  runtime::KvLayout kv_cache_layout() const override;

 private:
  struct Replica {
    std::unique_ptr<deploy::FrameConnection> conn;
    bool said_hello = false;
    bool left = false;  // connection closed after a shutdown
    int64_t live = 0;   // requests sent and not finished
    runtime::EngineStats stats;
  };
  struct Live {
    int replica = 0;
    OutputCallback callback;
    // Imported device rows (KvRows::device): kept -- with their release token -- until the
    // replica says it copied them (kv_imported) or the request ends.
    std::shared_ptr<const runtime::KvRows> device_rows;
  };
  // A request whose rows its replica holds (or will, once it finishes), until `until`.
  struct Held {
    int replica = 0;
    std::chrono::steady_clock::time_point until;
  };
  // A frame for the sender thread: an abort or a release_kv.
  struct Outgoing {
    int replica = 0;
    uint64_t id = 0;
    deploy::EngineMessage::Kind kind = deploy::EngineMessage::Kind::kAbort;
  };
  struct Pending {
    std::unique_ptr<deploy::FrameConnection> conn;
    std::string nonce;  // hex, of the challenge sent
    std::chrono::steady_clock::time_point since;
  };
  void IoLoop();
  void SendQueued();  // the sender thread: the queued aborts and releases, in order
  void Queue(Outgoing frame);
  // Drops pending connection `i` with a log line (and a refusal frame when `tell`).
  void DropPending(size_t i, const std::string& why, bool tell);
  // connection: a pending connection's index (its hello), else SIZE_MAX; replica: the replica
  // that sent m once it said hello (its step reports are its load), else -1.
  void Handle(size_t connection, int replica, deploy::EngineMessage m);
  void FailLocked(const std::string& why, std::vector<std::pair<OutputCallback, uint64_t>>& out)
      AFD_REQUIRES(mu_);
  void Deliver(std::vector<std::pair<OutputCallback, uint64_t>>& failed, const std::string& why);

  const int num_replicas_, first_dp_rank_;
  comm::Socket listener_;
  std::string endpoint_;
  mutable Mutex mu_;
  const EngineListenOptions listen_;
  std::vector<Pending> pending_;   // accepted, no hello yet
  std::vector<Replica> replicas_;  // by dp_rank - first
  std::map<uint64_t, Live> live_;
  EngineModelInfo info_;
  ConnectorRoundTrips round_trips_;
  std::string failure_;
  bool shutting_down_ = false;
  std::atomic<bool> stop_{false};
  std::deque<Outgoing> outgoing_ AFD_GUARDED_BY(mu_);
  std::condition_variable_any outgoing_cv_;
  std::map<uint64_t, Held> held_ AFD_GUARDED_BY(mu_);
  // ExportHeldKv calls waiting for their kv_rows answer, by request id.
  std::map<uint64_t, std::shared_ptr<std::promise<std::shared_ptr<const runtime::KvRows>>>> exports_
      AFD_GUARDED_BY(mu_);
  runtime::KvLayout kv_layout_ AFD_GUARDED_BY(mu_);  // of the first hello
  bool stop_sender_ AFD_GUARDED_BY(mu_) = false;
  std::thread io_;
  std::thread sender_;
};

}  // namespace afd::server

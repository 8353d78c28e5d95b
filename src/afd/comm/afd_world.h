// Joining an AFD deployment: the rendezvous, the join checks and the process groups.
//
// Join(): world rank 0 (FFN rank 0) serves the rendezvous store on the configured port; every
// rank connects to it, claims its (role, role rank) -- a second claimant is named and fails --,
// publishes a fingerprint of what all ranks must agree on (host, port, rank counts, connector,
// gate placement, hidden size, dtype), and waits until every rank of the topology has joined.
// Any disagreement fails the join on every rank that sees it, naming the field, the two values
// and the two ranks, and is broadcast through an abort key so the others fail fast too. At
// timeout the error lists the ranks that never arrived.
//
// The store listens on the configured host's address only and admits a process only once it
// has proven the join secret (join_secret.h); without a secret, only a loopback deployment may
// run.
//
// Liveness: once joined, every rank bumps its heartbeat key "hb/<world rank>" from a thread of
// its own every heartbeat_interval_s(); world rank 0 watches them and, when one stops for
// heartbeat_silence_s() (a process stopped or hung as a whole, or its host cut off),
// aborts the deployment naming that rank -- so idle loops that call CheckAbort() end.
//
// CreateGroup(): a communicator over any set of world ranks, keyed by name in the store (data
// plane subgroups "afd_subgroup_<g>", control plane "p2p", later attention TP and FFN EP groups).
//
// Thread safety: one thread at a time.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "afd/comm/communicator.h"
#include "afd/comm/store.h"
#include "afd/comm/tcp_communicator.h"
#include "afd/common/dtype.h"
#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"
#include "afd/config/afd_config.h"
#include "afd/topology/topology.h"

namespace afd::comm {

struct JoinRequest {
  AfdConfig config;
  int role_rank = 0;          // this process's rank within config.role
  int64_t hidden_size = 0;    // model hidden size, must agree across ranks
  DType dtype = DType::kF32;  // dtype of hidden states on the wire
  // More (name, value) pairs every rank must agree on, e.g. the model's layer and expert layout.
  std::vector<std::pair<std::string, std::string>> extra_fields;
};

// Creates a communicator for a group; the default makes TcpCommunicators. The NCCL build passes
// one that makes NcclCommunicators.
using CommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(Store& group_store, const GroupSpec& spec)>;

class AfdWorld {
 public:
  // Joins; throws afd::Error as described above. Every wait is bounded by
  // config.afd_process_group_timeout_s.
  static std::unique_ptr<AfdWorld> Join(const JoinRequest& request,
                                        CommunicatorFactory factory = nullptr);
  ~AfdWorld();

  const Topology& topology() const { return topology_; }
  const AfdConfig& config() const { return request_.config; }
  RoleRank self() const { return {request_.config.role, request_.role_rank}; }
  int world_rank() const { return world_rank_; }
  int64_t hidden_size() const { return request_.hidden_size; }
  DType dtype() const { return request_.dtype; }
  // The address this process publishes (its interface toward the rendezvous host).
  const std::string& local_address() const { return local_address_; }

  // "world rank 3 (attention 1)".
  std::string Describe(int world_rank) const;
  // The rendezvous store, for exchanges outside the process groups (e.g. the names of shared
  // memory windows); callers keep to a key prefix of their own. Thread safety: as TcpStoreClient.
  Store& store() { return *client_; }

  // Collective over `members` (world ranks, in group-rank order; must include this process).
  std::unique_ptr<Communicator> CreateGroup(const std::string& name,
                                            const std::vector<int>& members);

  // How often the heartbeat thread beats: a tenth of the timeout, at most once a second.
  double heartbeat_interval_s() const;
  // How long a rank's heartbeat may stay unchanged before world rank 0 declares it stopped:
  // the timeout, at least 2 s.
  double heartbeat_silence_s() const;

  // Publishes an abort message so ranks still joining, forming groups, idle or in a barrier
  // fail fast, naming the root cause. The first message wins.
  void Abort(const std::string& message);
  // Throws afd::Error carrying the abort message if any rank has aborted (a stalled heartbeat
  // is reported that way), or, on world rank 0, when its store stopped serving.
  void CheckAbort();
  // The abort message, if any rank has aborted (nullopt also when the store is unreachable).
  std::optional<std::string> AbortMessage();
  // Waits until every world rank reaches the barrier `name` (store-based). Throws on abort, or
  // at timeout naming the ranks that never arrived.
  void Barrier(const std::string& name);

 private:
  AfdWorld(JoinRequest request, CommunicatorFactory factory);
  void VerifyJoin();
  // Called when an operation of one of this world's groups failed with `e`: throws `e`
  // explained by the abort message of another rank if one appears within a short grace (three
  // heartbeat periods); returns when there is none.
  void ExplainFailure(const Error& e);
  void StartHeartbeat();
  void HeartbeatLoop();
  // World rank 0: aborts naming a rank whose heartbeat is stale; false once it has aborted.
  bool WatchHeartbeats(std::vector<std::string>& last_value,
                       std::vector<std::chrono::steady_clock::time_point>& last_change);

  JoinRequest request_;
  CommunicatorFactory factory_;
  Topology topology_;
  int world_rank_;
  std::string local_address_;
  std::unique_ptr<TcpStoreServer> server_;  // world rank 0 only
  std::unique_ptr<TcpStoreClient> client_;
  std::optional<std::string> secret_;  // the join secret, handed to every group
  bool joined_ = false;                // the join completed (rank 0 then lingers for the others)

  std::thread heartbeat_;
  Mutex heartbeat_mu_;
  std::condition_variable_any heartbeat_cv_;
  bool heartbeat_stop_ AFD_GUARDED_BY(heartbeat_mu_) = false;
};

// The fingerprint fields in a fixed order, as (name, value) pairs. Exposed for tests.
std::vector<std::pair<std::string, std::string>> JoinFingerprint(const JoinRequest& request);

}  // namespace afd::comm

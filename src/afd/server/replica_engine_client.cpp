#include "afd/server/replica_engine_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "afd/common/error.h"
#include "afd/common/sha256.h"
#include "afd/common/thread_annotations.h"

namespace afd::server {

namespace {

constexpr double kSendTimeoutSeconds = 30;

}  // namespace

ReplicaEngineClient::ReplicaEngineClient(int num_replicas, int first_dp_rank,
                                         EngineListenOptions listen)
    : num_replicas_(num_replicas),
      first_dp_rank_(first_dp_rank),
      listen_(std::move(listen)),
      replicas_(num_replicas) {
  AFD_CHECK(num_replicas >= 1, "an engine client needs at least one replica, got {}", num_replicas);
  listener_ = comm::Listen(listen_.host, listen_.port);
  const bool any = listen_.host.empty() || listen_.host == "0.0.0.0";
  endpoint_ = fmt::format("{}:{}", any ? "127.0.0.1" : listen_.host, comm::LocalPort(listener_));
  const std::vector<double>& bounds = deploy::RoundTripBounds();
  round_trips_.bucket_bounds_s = bounds;
  round_trips_.bucket_counts.assign(bounds.size() + 1, 0);
  io_ = std::thread([this] { IoLoop(); });
  sender_ = std::thread([this] { SendQueued(); });
}

ReplicaEngineClient::~ReplicaEngineClient() {
  {
    MutexLock lock(mu_);
    stop_sender_ = true;
  }
  outgoing_cv_.notify_all();
  sender_.join();
  stop_ = true;
  io_.join();
  SetFailure("the server stopped");
}

bool ReplicaEngineClient::WaitReady(double timeout_s) {
  const Deadline deadline = Deadline::In(timeout_s);
  while (!deadline.expired()) {
    if (Ready()) return true;
    if (!Failure().empty()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string missing;
  {
    MutexLock lock(mu_);
    for (int r = 0; r < num_replicas_; ++r) {
      if (!replicas_[r].said_hello) missing += fmt::format(" {}", first_dp_rank_ + r);
    }
  }
  if (missing.empty()) return true;
  SetFailure(
      fmt::format("attention replica(s){} did not connect to the engine listener {} "
                  "within {} s",
                  missing, endpoint_, timeout_s));
  return false;
}

bool ReplicaEngineClient::Ready() const {
  MutexLock lock(mu_);
  if (!failure_.empty() || shutting_down_) return false;
  for (const Replica& r : replicas_) {
    if (!r.said_hello) return false;
  }
  return true;
}

std::string ReplicaEngineClient::Failure() const {
  MutexLock lock(mu_);
  return failure_;
}

int64_t ReplicaEngineClient::num_live() const {
  MutexLock lock(mu_);
  return static_cast<int64_t>(live_.size());
}

const EngineModelInfo& ReplicaEngineClient::model_info() const {
  MutexLock lock(mu_);
  AFD_CHECK(replicas_[0].said_hello, "the engines are not ready yet");
  return info_;  // set once by the first hello, never changed after
}

void ReplicaEngineClient::FailLocked(const std::string& why,
                                     std::vector<std::pair<OutputCallback, uint64_t>>& out) {
  if (failure_.empty()) failure_ = why;
  for (auto& [id, l] : live_) out.emplace_back(std::move(l.callback), id);
  live_.clear();
  for (Replica& r : replicas_) r.live = 0;
  // Exports waiting for a replica's answer get none now.
  for (auto& [id, result] : exports_) {
    result->set_exception(std::make_exception_ptr(Error(
        fmt::format("request {}: no KV rows to export: {}", id, failure_), __FILE__, __LINE__)));
  }
  exports_.clear();
  held_.clear();
}

void ReplicaEngineClient::Deliver(std::vector<std::pair<OutputCallback, uint64_t>>& failed,
                                  const std::string& why) {
  for (auto& [callback, id] : failed) callback(runtime::RequestOutput::Failed(id, why));
}

void ReplicaEngineClient::SetFailure(const std::string& why) {
  std::vector<std::pair<OutputCallback, uint64_t>> failed;
  std::string reason;
  {
    MutexLock lock(mu_);
    FailLocked(why, failed);
    reason = failure_;
  }
  Deliver(failed, reason);
}

void ReplicaEngineClient::Shutdown() {
  std::vector<deploy::FrameConnection*> conns;
  {
    MutexLock lock(mu_);
    shutting_down_ = true;
    for (Replica& r : replicas_) {
      if (r.conn && !r.left) conns.push_back(r.conn.get());
    }
  }
  deploy::EngineMessage m;
  m.kind = deploy::EngineMessage::Kind::kShutdown;
  const std::string frame = deploy::EncodeEngineMessage(m);
  for (deploy::FrameConnection* c : conns) {
    try {
      c->Send(frame, kSendTimeoutSeconds);
    } catch (const Error&) {
      // Already gone: nothing to tell it.
    }
  }
}

void ReplicaEngineClient::Submit(uint64_t id, runtime::RequestParams params,
                                 OutputCallback on_output) {
  deploy::FrameConnection* conn = nullptr;
  std::string refused;
  int chosen = -1;
  if (params.imported_kv && params.imported_kv->bytes.size() > deploy::kMaxKvAttachmentBytes) {
    // Past what one engine frame carries: this request alone fails, the deployment goes on.
    on_output(runtime::RequestOutput::Rejected(
        id, fmt::format("imported KV rows of {} bytes exceed the {} bytes an engine frame carries "
                        "to a deployment's replica",
                        params.imported_kv->bytes.size(), deploy::kMaxKvAttachmentBytes)));
    return;
  }
  {
    MutexLock lock(mu_);
    if (!failure_.empty()) {
      refused = failure_;
    } else if (shutting_down_) {
      refused = "the server is shutting down";
    } else {
      for (int r = 0; r < num_replicas_; ++r) {
        if (!replicas_[r].said_hello) {
          refused = "the engines are not ready yet";
          break;
        }
        if (chosen < 0 || replicas_[r].live < replicas_[chosen].live) chosen = r;
      }
    }
    if (refused.empty()) {
      AFD_CHECK(!live_.count(id), "request id {} is already live", id);
      live_[id] = {chosen, std::move(on_output),
                   params.imported_kv && params.imported_kv->device ? params.imported_kv : nullptr};
      ++replicas_[chosen].live;
      conn = replicas_[chosen].conn.get();
      const auto now = std::chrono::steady_clock::now();
      // Rows nobody fetched are freed by their replica at their deadline: forget them too.
      for (auto it = held_.begin(); it != held_.end();) {
        it = it->second.until < now ? held_.erase(it) : std::next(it);
      }
      if (params.hold_kv_s > 0 && std::isfinite(params.hold_kv_s)) {
        // (The engine checks the range; a minute of slack for the prefill itself.)
        held_[id] = {
            chosen,
            now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(std::min(params.hold_kv_s, 86400.0) + 60))};
      }
    }
  }
  if (!refused.empty()) {
    on_output(runtime::RequestOutput::Failed(id, refused));
    return;
  }
  deploy::EngineMessage m;
  m.kind = deploy::EngineMessage::Kind::kSubmit;
  m.id = id;
  m.params = std::move(params);
  try {
    conn->Send(deploy::EncodeEngineMessage(m), kSendTimeoutSeconds);
  } catch (const Error& e) {
    SetFailure(fmt::format("attention replica {}: {}", first_dp_rank_ + chosen, e.what()));
  }
}

void ReplicaEngineClient::Abort(uint64_t id) {
  // Queued for the sender thread: an abort comes from the HTTP front end's I/O threads (a client
  // gone, a stop string), which must never wait on a replica's socket.
  int replica = 0;
  {
    MutexLock lock(mu_);
    const auto it = live_.find(id);
    if (it == live_.end()) return;
    replica = it->second.replica;
  }
  Queue({replica, id, deploy::EngineMessage::Kind::kAbort});
}

void ReplicaEngineClient::Queue(Outgoing frame) {
  {
    MutexLock lock(mu_);
    outgoing_.push_back(frame);
  }
  outgoing_cv_.notify_one();
}

runtime::KvLayout ReplicaEngineClient::kv_cache_layout() const {
  MutexLock lock(mu_);
  return kv_layout_;
}

std::shared_ptr<const runtime::KvRows> ReplicaEngineClient::ExportHeldKv(uint64_t id,
                                                                         double timeout_s,
                                                                         bool device_ok) {
  auto result = std::make_shared<std::promise<std::shared_ptr<const runtime::KvRows>>>();
  std::future<std::shared_ptr<const runtime::KvRows>> done = result->get_future();
  deploy::FrameConnection* conn = nullptr;
  int replica = 0;
  {
    MutexLock lock(mu_);
    AFD_CHECK(failure_.empty(), "request {}: no KV rows to export: {}", id, failure_);
    const auto it = held_.find(id);
    AFD_CHECK(it != held_.end(),
              "request {} holds no KV rows (unknown, already released, or past its hold timeout)",
              id);
    AFD_CHECK(!exports_.count(id), "request {}: its KV rows are being exported already", id);
    replica = it->second.replica;
    AFD_CHECK(replicas_[replica].conn && !replicas_[replica].left,
              "request {}: attention replica {} has left", id, first_dp_rank_ + replica);
    conn = replicas_[replica].conn.get();
    exports_[id] = result;
  }
  deploy::EngineMessage m;
  m.kind = deploy::EngineMessage::Kind::kExportKv;
  m.id = id;
  m.device_ok = device_ok;
  try {
    conn->Send(deploy::EncodeEngineMessage(m), kSendTimeoutSeconds);
  } catch (const Error& e) {
    SetFailure(fmt::format("attention replica {}: {}", first_dp_rank_ + replica, e.what()));
  }
  if (done.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) {
    MutexLock lock(mu_);
    const auto it = exports_.find(id);
    if (it != exports_.end() && it->second == result) exports_.erase(it);
    AFD_THROW("request {}: attention replica {} did not send its KV rows within {} s", id,
              first_dp_rank_ + replica, timeout_s);
  }
  return done.get();
}

void ReplicaEngineClient::ReleaseHeldKv(uint64_t id) {
  int replica = 0;
  {
    MutexLock lock(mu_);
    const auto it = held_.find(id);
    if (it == held_.end()) return;
    replica = it->second.replica;
    held_.erase(it);
  }
  Queue({replica, id, deploy::EngineMessage::Kind::kReleaseKv});
}

void ReplicaEngineClient::SendQueued() {
  MutexLock lock(mu_);
  while (true) {
    while (!stop_sender_ && outgoing_.empty()) outgoing_cv_.wait(lock);
    if (outgoing_.empty()) return;  // stopping, nothing left
    const Outgoing next = outgoing_.front();
    outgoing_.pop_front();
    const int replica = next.replica;
    deploy::FrameConnection* conn = replicas_[replica].conn.get();
    if (conn == nullptr || replicas_[replica].left) continue;
    lock.unlock();
    deploy::EngineMessage m;
    m.kind = next.kind;
    m.id = next.id;
    try {
      conn->Send(deploy::EncodeEngineMessage(m), kSendTimeoutSeconds);
    } catch (const Error& e) {
      SetFailure(fmt::format("attention replica {}: {}", first_dp_rank_ + replica, e.what()));
    }
    lock.lock();
  }
}

EngineLoad ReplicaEngineClient::Load() const {
  MutexLock lock(mu_);
  EngineLoad load;
  for (const Replica& r : replicas_) {
    load.engines.push_back(r.stats);
    load.total.num_running += r.stats.num_running;
    load.total.num_waiting += r.stats.num_waiting;
    load.total.kv_blocks_used += r.stats.kv_blocks_used;
    load.total.kv_blocks_total += r.stats.kv_blocks_total;
    load.total.num_preemptions += r.stats.num_preemptions;
    load.total.steps += r.stats.steps;
  }
  // Sent but not yet seen in a replica's report: waiting as well.
  int64_t reported = load.total.num_running + load.total.num_waiting;
  const int64_t live = static_cast<int64_t>(live_.size());
  if (live > reported) load.total.num_waiting += live - reported;
  load.connector = round_trips_;
  for (size_t b = 1; b < load.connector.bucket_counts.size(); ++b) {
    load.connector.bucket_counts[b] += load.connector.bucket_counts[b - 1];  // cumulative
  }
  return load;
}

void ReplicaEngineClient::Handle(size_t connection, int replica, deploy::EngineMessage m) {
  using Kind = deploy::EngineMessage::Kind;
  std::vector<std::pair<OutputCallback, uint64_t>> failed;
  std::string reason;
  if (m.kind == Kind::kHello) {
    MutexLock lock(mu_);
    const int r = m.hello.dp_rank - first_dp_rank_;
    std::string problem;
    if (r < 0 || r >= num_replicas_) {
      problem = fmt::format("a replica said it is DP rank {}, outside this server's {}..{}",
                            m.hello.dp_rank, first_dp_rank_, first_dp_rank_ + num_replicas_ - 1);
    } else if (replicas_[r].said_hello) {
      problem = fmt::format("two processes said they are attention replica {}", m.hello.dp_rank);
    } else if (info_.vocab_size != 0 && (kv_layout_.model != m.hello.kv_layout.model ||
                                         kv_layout_.row_width != m.hello.kv_layout.row_width ||
                                         kv_layout_.dtype != m.hello.kv_layout.dtype)) {
      problem = fmt::format(
          "attention replica {} keeps its KV cache as \"{}\" ({}-wide {} rows), the others as "
          "\"{}\" ({}-wide {} rows)",
          m.hello.dp_rank, m.hello.kv_layout.model, m.hello.kv_layout.row_width,
          DTypeName(m.hello.kv_layout.dtype), kv_layout_.model, kv_layout_.row_width,
          DTypeName(kv_layout_.dtype));
    } else if (info_.vocab_size != 0 && (info_.vocab_size != m.hello.vocab_size ||
                                         info_.max_model_len != m.hello.max_model_len)) {
      problem = fmt::format(
          "attention replica {} runs another model (vocabulary {}, max length {}) than the "
          "others ({}, {})",
          m.hello.dp_rank, m.hello.vocab_size, m.hello.max_model_len, info_.vocab_size,
          info_.max_model_len);
    }
    if (!problem.empty()) {
      FailLocked(problem, failed);
      reason = failure_;
    } else {
      replicas_[r].conn = std::move(pending_[connection].conn);
      replicas_[r].conn->set_max_frame_bytes(deploy::kMaxEngineFrameBytes);
      replicas_[r].said_hello = true;
      replicas_[r].stats.kv_blocks_total = m.hello.kv_blocks;
      if (info_.vocab_size == 0) {
        info_.vocab_size = m.hello.vocab_size;
        info_.max_model_len = m.hello.max_model_len;
        info_.eos_token_ids = m.hello.eos_token_ids;
        kv_layout_ = m.hello.kv_layout;
      }
    }
  } else if (m.kind == Kind::kStep) {
    std::vector<std::pair<OutputCallback, runtime::RequestOutput>> calls;
    {
      MutexLock lock(mu_);
      // The replica's load as its engine reports it (running, waiting, KV blocks): what
      // /metrics and admission count, as an engine in this process would.
      if (replica >= 0 && replica < num_replicas_) replicas_[replica].stats = m.stats;
      for (runtime::RequestOutput& o : m.outputs) {
        if (o.finished && !o.kv_held) held_.erase(o.request_id);
        const auto it = live_.find(o.request_id);
        if (it == live_.end()) continue;  // failed or aborted meanwhile
        if (o.kv_imported) it->second.device_rows.reset();
        if (o.finished) {
          --replicas_[it->second.replica].live;
          calls.emplace_back(std::move(it->second.callback), std::move(o));
          live_.erase(it);
        } else {
          calls.emplace_back(it->second.callback, std::move(o));
        }
      }
      for (size_t b = 0;
           b < m.round_trips.bucket_counts.size() && b < round_trips_.bucket_counts.size(); ++b) {
        round_trips_.bucket_counts[b] += m.round_trips.bucket_counts[b];
      }
      round_trips_.count += m.round_trips.count;
      round_trips_.sum_s += m.round_trips.sum_s;
    }
    for (auto& [callback, o] : calls) callback(o);
    return;
  } else if (m.kind == Kind::kKvRows) {
    std::shared_ptr<std::promise<std::shared_ptr<const runtime::KvRows>>> result;
    {
      MutexLock lock(mu_);
      const auto it = exports_.find(m.id);
      if (it == exports_.end()) return;  // its caller gave up waiting
      result = std::move(it->second);
      exports_.erase(it);
    }
    if (m.kv) {
      result->set_value(std::move(m.kv));
    } else {
      result->set_exception(std::make_exception_ptr(Error(m.why, __FILE__, __LINE__)));
    }
    return;
  } else {
    MutexLock lock(mu_);
    FailLocked(fmt::format("an attention replica sent an unexpected {} message",
                           deploy::EngineMessageKindName(m.kind)),
               failed);
    reason = failure_;
  }
  Deliver(failed, reason);
}

namespace {

// "10.0.0.7:51234" of a connected socket, or "an unknown peer".
std::string PeerAddress(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET) {
    return "an unknown peer";
  }
  char host[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
  return fmt::format("{}:{}", host, ntohs(a.sin_port));
}

constexpr double kHelloTimeoutSeconds = 30;
// Before its hello proves the secret, a connection may send one small frame, and only so many
// may wait at once: an unauthenticated peer cannot make the listener buffer much.
constexpr uint32_t kMaxHelloFrameBytes = 64 * 1024;
constexpr size_t kMaxPendingConnections = 64;

}  // namespace

void ReplicaEngineClient::DropPending(size_t i, const std::string& why, bool tell) {
  std::unique_ptr<deploy::FrameConnection> conn;
  {
    MutexLock lock(mu_);
    conn = std::move(pending_[i].conn);
  }
  if (!conn) return;
  if (tell) {
    deploy::EngineMessage m;
    m.kind = deploy::EngineMessage::Kind::kRefused;
    m.why = why;
    try {
      conn->Send(deploy::EncodeEngineMessage(m), 1.0);
    } catch (const Error&) {
    }
  }
  std::fprintf(stderr, "afd serve: refused an engine connection from %s: %s\n",
               conn->peer().c_str(), why.c_str());
}

void ReplicaEngineClient::IoLoop() {
  using Kind = deploy::EngineMessage::Kind;
  while (!stop_) {
    // Poll the listener and every connection (pending ones and those of the replicas).
    std::vector<pollfd> fds = {{listener_.fd(), POLLIN, 0}};
    std::vector<std::pair<bool, size_t>> owners;  // (is a replica, index)
    {
      MutexLock lock(mu_);
      // Slots of connections that said hello or were dropped go (indices are taken afresh).
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                    [](const Pending& p) { return !p.conn; }),
                     pending_.end());
      for (size_t i = 0; i < pending_.size(); ++i) {
        if (pending_[i].conn) {
          fds.push_back({pending_[i].conn->fd(), POLLIN, 0});
          owners.emplace_back(false, i);
        }
      }
      for (size_t i = 0; i < replicas_.size(); ++i) {
        if (replicas_[i].conn && !replicas_[i].left) {
          fds.push_back({replicas_[i].conn->fd(), POLLIN, 0});
          owners.emplace_back(true, i);
        }
      }
    }
    const int n = poll(fds.data(), fds.size(), 50);
    // Connections that said nothing within the bound are dropped (they hold a slot only).
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < pending_.size(); ++i) {
      bool stale;
      {
        MutexLock lock(mu_);
        stale = pending_[i].conn &&
                now - pending_[i].since > std::chrono::duration<double>(kHelloTimeoutSeconds);
      }
      if (stale) {
        DropPending(i, fmt::format("no hello within {} s of connecting", kHelloTimeoutSeconds),
                    true);
      }
    }
    if (n <= 0) continue;
    if (fds[0].revents & POLLIN) {
      try {
        comm::Socket s = comm::Accept(listener_, Deadline::In(1.0), "an attention replica");
        const std::string peer = "attention replica connection " + PeerAddress(s.fd());
        auto conn = std::make_unique<deploy::FrameConnection>(std::move(s), peer);
        size_t waiting = 0;
        {
          MutexLock lock(mu_);
          for (const Pending& p : pending_) waiting += p.conn ? 1 : 0;
        }
        if (waiting >= kMaxPendingConnections) {
          std::fprintf(stderr,
                       "afd serve: refused an engine connection from %s: %zu connections are "
                       "waiting to authenticate already\n",
                       peer.c_str(), waiting);
          continue;
        }
        conn->set_max_frame_bytes(kMaxHelloFrameBytes);
        deploy::EngineMessage challenge;
        challenge.kind = deploy::EngineMessage::Kind::kChallenge;
        challenge.challenge.nonce = ToHex(RandomBytes(32));
        challenge.challenge.secret = listen_.secret.has_value();
        conn->Send(deploy::EncodeEngineMessage(challenge), 5.0);
        MutexLock lock(mu_);
        pending_.push_back({std::move(conn), challenge.challenge.nonce, now});
      } catch (const Error&) {
        // The peer went away before we accepted it, or took no challenge: nothing to serve.
        // (Out of descriptors, accept keeps failing: wait a little rather than spin.)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const auto [is_replica, index] = owners[k - 1];
      deploy::FrameConnection* conn;
      std::string nonce;
      {
        MutexLock lock(mu_);
        conn = is_replica ? replicas_[index].conn.get() : pending_[index].conn.get();
        if (!is_replica) nonce = pending_[index].nonce;
      }
      if (!conn) continue;
      bool greeted = is_replica;
      int replica = is_replica ? static_cast<int>(index) : -1;  // once it said hello
      try {
        // A pending connection's first frame is its hello (which moves the connection to its
        // replica); frames that came with it in the same read are handled right after.
        while (std::optional<std::string> f = conn->Poll(0)) {
          deploy::EngineMessage m = deploy::DecodeEngineMessage(*f, conn->peer());
          AFD_CHECK(greeted || m.kind == Kind::kHello, "{} sent a frame before its hello",
                    conn->peer());
          AFD_CHECK(!greeted || m.kind != Kind::kHello, "{} said hello twice", conn->peer());
          if (!greeted) {
            const std::string want =
                deploy::EngineHelloProof(listen_.secret, nonce, m.hello.dp_rank);
            if (listen_.secret && !DigestsEqual(m.hello.proof, want)) {
              DropPending(index,
                          "its hello does not prove this deployment's join secret (the "
                          "processes have different AFD_JOIN_SECRET / AFD_JOIN_SECRET_FILE)",
                          true);
              break;
            }
          }
          const int said = m.hello.dp_rank - first_dp_rank_;
          const bool hello = !greeted;
          Handle(greeted ? SIZE_MAX : index, greeted ? replica : -1, std::move(m));
          greeted = true;
          if (hello) replica = said;
          if (!Failure().empty()) break;
        }
      } catch (const Error& e) {
        if (replica < 0 || replica >= num_replicas_) {
          // Before its hello a connection is nobody's: drop it, the deployment goes on (the
          // ready timeout names replicas that never come).
          DropPending(index, e.what(), false);
          continue;
        }
        bool expected;
        {
          MutexLock lock(mu_);
          expected = shutting_down_;
          replicas_[replica].left = true;
        }
        if (!expected) {
          SetFailure(fmt::format("attention replica {} lost its engine connection: {}",
                                 first_dp_rank_ + replica, e.what()));
        }
      }
    }
  }
}

}  // namespace afd::server

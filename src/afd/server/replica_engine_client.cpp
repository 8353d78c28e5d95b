#include "afd/server/replica_engine_client.h"

#include <poll.h>

#include <chrono>

#include "afd/common/error.h"

namespace afd::server {

namespace {

constexpr double kSendTimeoutSeconds = 30;

}  // namespace

ReplicaEngineClient::ReplicaEngineClient(int num_replicas, int first_dp_rank)
    : num_replicas_(num_replicas), first_dp_rank_(first_dp_rank), replicas_(num_replicas) {
  AFD_CHECK(num_replicas >= 1, "an engine client needs at least one replica, got {}", num_replicas);
  listener_ = comm::Listen("127.0.0.1", 0);
  endpoint_ = fmt::format("127.0.0.1:{}", comm::LocalPort(listener_));
  const std::vector<double>& bounds = deploy::RoundTripBounds();
  round_trips_.bucket_bounds_s = bounds;
  round_trips_.bucket_counts.assign(bounds.size() + 1, 0);
  io_ = std::thread([this] { IoLoop(); });
}

ReplicaEngineClient::~ReplicaEngineClient() {
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
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty() || shutting_down_) return false;
  for (const Replica& r : replicas_) {
    if (!r.said_hello) return false;
  }
  return true;
}

std::string ReplicaEngineClient::Failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

int64_t ReplicaEngineClient::num_live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(live_.size());
}

const EngineModelInfo& ReplicaEngineClient::model_info() const {
  std::lock_guard<std::mutex> lock(mu_);
  AFD_CHECK(replicas_[0].said_hello, "the engines are not ready yet");
  return info_;  // set once by the first hello, never changed after
}

void ReplicaEngineClient::FailLocked(const std::string& why,
                                     std::vector<std::pair<OutputCallback, uint64_t>>& out) {
  if (failure_.empty()) failure_ = why;
  for (auto& [id, l] : live_) out.emplace_back(std::move(l.callback), id);
  live_.clear();
  for (Replica& r : replicas_) r.live = 0;
}

void ReplicaEngineClient::Deliver(std::vector<std::pair<OutputCallback, uint64_t>>& failed,
                                  const std::string& why) {
  for (auto& [callback, id] : failed) callback(runtime::RequestOutput::Failed(id, why));
}

void ReplicaEngineClient::SetFailure(const std::string& why) {
  std::vector<std::pair<OutputCallback, uint64_t>> failed;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(why, failed);
    reason = failure_;
  }
  Deliver(failed, reason);
}

void ReplicaEngineClient::Shutdown() {
  std::vector<deploy::FrameConnection*> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  {
    std::lock_guard<std::mutex> lock(mu_);
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
      live_[id] = {chosen, std::move(on_output)};
      ++replicas_[chosen].live;
      conn = replicas_[chosen].conn.get();
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
  deploy::FrameConnection* conn = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(id);
    if (it == live_.end()) return;
    conn = replicas_[it->second.replica].conn.get();
  }
  deploy::EngineMessage m;
  m.kind = deploy::EngineMessage::Kind::kAbort;
  m.id = id;
  try {
    conn->Send(deploy::EncodeEngineMessage(m), kSendTimeoutSeconds);
  } catch (const Error& e) {
    SetFailure(e.what());
  }
}

EngineLoad ReplicaEngineClient::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
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

void ReplicaEngineClient::Handle(size_t connection, deploy::EngineMessage m) {
  using Kind = deploy::EngineMessage::Kind;
  std::vector<std::pair<OutputCallback, uint64_t>> failed;
  std::string reason;
  if (m.kind == Kind::kHello) {
    std::lock_guard<std::mutex> lock(mu_);
    const int r = m.hello.dp_rank - first_dp_rank_;
    std::string problem;
    if (r < 0 || r >= num_replicas_) {
      problem = fmt::format("a replica said it is DP rank {}, outside this server's {}..{}",
                            m.hello.dp_rank, first_dp_rank_, first_dp_rank_ + num_replicas_ - 1);
    } else if (replicas_[r].said_hello) {
      problem = fmt::format("two processes said they are attention replica {}", m.hello.dp_rank);
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
      replicas_[r].conn = std::move(pending_[connection]);
      replicas_[r].said_hello = true;
      replicas_[r].stats.kv_blocks_total = m.hello.kv_blocks;
      if (info_.vocab_size == 0) {
        info_.vocab_size = m.hello.vocab_size;
        info_.max_model_len = m.hello.max_model_len;
        info_.eos_token_ids = m.hello.eos_token_ids;
      }
    }
  } else if (m.kind == Kind::kStep) {
    std::vector<std::pair<OutputCallback, runtime::RequestOutput>> calls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (runtime::RequestOutput& o : m.outputs) {
        const auto it = live_.find(o.request_id);
        if (it == live_.end()) continue;  // failed or aborted meanwhile
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
  }
  Deliver(failed, reason);
}

void ReplicaEngineClient::IoLoop() {
  using Kind = deploy::EngineMessage::Kind;
  while (!stop_) {
    // Poll the listener and every connection (pending ones and those of the replicas).
    std::vector<pollfd> fds = {{listener_.fd(), POLLIN, 0}};
    std::vector<std::pair<bool, size_t>> owners;  // (is a replica, index)
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < pending_.size(); ++i) {
        if (pending_[i]) {
          fds.push_back({pending_[i]->fd(), POLLIN, 0});
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
    if (n <= 0) continue;
    if (fds[0].revents & POLLIN) {
      try {
        comm::Socket s = comm::Accept(listener_, Deadline::In(1.0), "an attention replica");
        std::lock_guard<std::mutex> lock(mu_);
        pending_.push_back(
            std::make_unique<deploy::FrameConnection>(std::move(s), "an attention replica"));
      } catch (const Error&) {
        // The peer went away before we accepted it: nothing to serve.
      }
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const auto [is_replica, index] = owners[k - 1];
      deploy::FrameConnection* conn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        conn = is_replica ? replicas_[index].conn.get() : pending_[index].get();
      }
      if (!conn) continue;
      try {
        // A pending connection's first frame is its hello (which moves the connection to its
        // replica); frames that came with it in the same read are handled right after.
        bool greeted = is_replica;
        while (std::optional<std::string> f = conn->Poll(0)) {
          deploy::EngineMessage m = deploy::DecodeEngineMessage(*f, conn->peer());
          AFD_CHECK(greeted || m.kind == Kind::kHello, "{} sent a frame before its hello",
                    conn->peer());
          AFD_CHECK(!greeted || m.kind != Kind::kHello, "{} said hello twice", conn->peer());
          Handle(greeted ? SIZE_MAX : index, std::move(m));
          greeted = true;
          if (!Failure().empty()) break;
        }
      } catch (const Error& e) {
        bool expected;
        {
          std::lock_guard<std::mutex> lock(mu_);
          expected = shutting_down_;
          if (is_replica) {
            replicas_[index].left = true;
          } else {
            pending_[index].reset();
          }
        }
        if (!expected) {
          SetFailure(is_replica ? fmt::format("attention replica {} lost its engine connection: {}",
                                              first_dp_rank_ + static_cast<int>(index), e.what())
                                : fmt::format("an attention replica failed before its hello: {}",
                                              e.what()));
        }
      }
    }
  }
}

}  // namespace afd::server

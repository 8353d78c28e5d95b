#include "afd/deploy/replica_serve.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "afd/comm/join_secret.h"
#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"
#include "afd/common/work_queue.h"
#include "afd/deploy/engine_wire.h"
#include "afd/pd/kv_transport.h"

namespace afd::deploy {

namespace {

constexpr double kChallengeTimeoutSeconds = 10;

// How long an idle replica waits for the frontend before the next idle step.
constexpr double kIdleWaitSeconds = 0.002;
constexpr double kSendTimeoutSeconds = 60;

// Rank 0 of the replica sends the frames it received to the other TP ranks.
std::vector<std::string> ShareFrames(comm::Communicator* tp_comm, int tp_rank,
                                     std::vector<std::string> frames) {
  if (!tp_comm) return frames;
  if (tp_rank == 0) {
    for (int peer = 1; peer < tp_comm->size(); ++peer) {
      int64_t n = static_cast<int64_t>(frames.size());
      tp_comm->Send(&n, 1, DType::kI64, peer, 0);
      for (const std::string& f : frames) {
        int64_t bytes = static_cast<int64_t>(f.size());
        tp_comm->Send(&bytes, 1, DType::kI64, peer, 1);
        if (bytes > 0) tp_comm->Send(f.data(), f.size(), DType::kU8, peer, 2);
      }
    }
    return frames;
  }
  int64_t n = 0;
  tp_comm->Recv(&n, 1, DType::kI64, 0, 0);
  AFD_CHECK(n >= 0 && n < (1 << 24), "TP rank 0 announced {} engine frames", n);
  frames.assign(n, {});
  for (std::string& f : frames) {
    int64_t bytes = 0;
    tp_comm->Recv(&bytes, 1, DType::kI64, 0, 1);
    AFD_CHECK(bytes >= 0 && bytes <= kMaxEngineFrameBytes, "TP rank 0 announced a {}-byte frame",
              bytes);
    f.resize(bytes);
    if (bytes > 0) tp_comm->Recv(f.data(), f.size(), DType::kU8, 0, 2);
  }
  return frames;
}

// Sends kv_rows answers off the serve loop (one thread, in order): encoding and sending the rows
// of a long prompt (up to hundreds of MB) must not hold the engine's steps. FrameConnection::Send
// locks, so these frames and the loop's step frames go whole, in either order (the frontend
// reads each kind on its own). A send that fails is the loop's error at its next turn.
class RowSender {
 public:
  explicit RowSender(FrameConnection& conn) : conn_(conn) {}
  // (~WorkQueue sends what is queued, then joins.)
  void Queue(EngineMessage m) {
    AFD_CHECK(sends_.Post([this, m = std::move(m)] {
      try {
        conn_.Send(EncodeEngineMessage(m), kSendTimeoutSeconds);
      } catch (const Error& e) {
        MutexLock lock(mu_);
        if (failure_.empty()) failure_ = e.what();
      }
    }),
              "the KV rows sender stopped");
  }
  void ThrowIfFailed() {
    MutexLock lock(mu_);
    if (!failure_.empty()) AFD_THROW("sending KV rows to the frontend: {}", failure_);
  }

 private:
  FrameConnection& conn_;
  Mutex mu_;
  std::string failure_ AFD_GUARDED_BY(mu_);
  WorkQueue sends_{1, SIZE_MAX};  // last: joined before the members its tasks use go
};

RoundTripReport Histogram(const std::vector<double>& samples) {
  const std::vector<double>& bounds = RoundTripBounds();
  RoundTripReport r;
  r.bucket_counts.assign(bounds.size() + 1, 0);
  for (double s : samples) {
    const size_t b = std::lower_bound(bounds.begin(), bounds.end(), s) - bounds.begin();
    ++r.bucket_counts[b];
    r.sum_s += s;
    ++r.count;
  }
  return r;
}

}  // namespace

std::pair<std::string, int> ParseEndpoint(const std::string& endpoint, const std::string& what) {
  const size_t colon = endpoint.rfind(':');
  AFD_CHECK(colon != std::string::npos && colon > 0, "{} \"{}\": expected host:port", what,
            endpoint);
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(endpoint.substr(colon + 1), &used);
    AFD_CHECK(used == endpoint.size() - colon - 1, "trailing characters");
  } catch (const std::exception&) {
    AFD_THROW("{} \"{}\": the port is not a number", what, endpoint);
  }
  AFD_CHECK(port > 0 && port < 65536, "{} \"{}\": port {} out of range", what, endpoint, port);
  return {endpoint.substr(0, colon), port};
}

void ServeReplica(const model::MoeModel& model, comm::AfdWorld* world,
                  runtime::ReplicaRunner& runner, const ReplicaServeOptions& o) {
  runtime::Engine engine(model, runner, o.engine);
  runner.RecordRoundTrips();
  std::unique_ptr<comm::Communicator> tp_comm;
  if (o.tp > 1) {
    AFD_CHECK(world != nullptr, "a replica of {} ranks needs the AFD world for its TP group", o.tp);
    std::vector<int> ranks;
    for (int i = 0; i < o.tp; ++i) {
      ranks.push_back(world->topology().WorldRank({Role::kAttention, o.dp_rank * o.tp + i}));
    }
    tp_comm = world->CreateGroup(fmt::format("serve_tp_{}", o.dp_rank), ranks);
  }
  std::unique_ptr<FrameConnection> conn;
  if (o.tp_rank == 0) {
    const auto [host, port] = ParseEndpoint(o.endpoint, "--engine-endpoint");
    const std::string peer = fmt::format("the frontend's engine listener {}", o.endpoint);
    // The join secret, as the rendezvous store's policy has it: none only on loopback.
    const std::optional<std::string> secret = comm::ResolveJoinSecret(host);
    const Deadline connect_by = Deadline::In(o.connect_timeout_s);
    conn = std::make_unique<FrameConnection>(comm::Connect(host, port, connect_by, peer), peer);
    // The frontend's challenge first; the hello proves the secret over its nonce.
    std::optional<std::string> first;
    const Deadline challenge_by = Deadline::In(kChallengeTimeoutSeconds);
    while (!(first = conn->Poll(0.1))) {
      AFD_CHECK(!challenge_by.expired(), "{} sent no challenge within {} s of the connection", peer,
                kChallengeTimeoutSeconds);
    }
    const EngineMessage challenge = DecodeEngineMessage(*first, peer);
    AFD_CHECK(challenge.kind == EngineMessage::Kind::kChallenge,
              "{} did not start with a challenge (is it an older afd, or something else?)", peer);
    AFD_CHECK(challenge.challenge.secret || !secret,
              "{} runs without a join secret but this process has one: start the API server "
              "with the same AFD_JOIN_SECRET / AFD_JOIN_SECRET_FILE",
              peer);
    AFD_CHECK(!challenge.challenge.secret || secret,
              "{} requires a join secret and this process has none: set the deployment's "
              "secret through AFD_JOIN_SECRET or AFD_JOIN_SECRET_FILE",
              peer);
    EngineMessage hello;
    hello.kind = EngineMessage::Kind::kHello;
    hello.hello.dp_rank = o.dp_rank;
    hello.hello.proof = EngineHelloProof(secret, challenge.challenge.nonce, o.dp_rank);
    hello.hello.vocab_size = model.config().vocab_size;
    hello.hello.max_model_len = engine.max_model_len();
    for (int64_t id : model.config().eos_token_ids) {
      hello.hello.eos_token_ids.push_back(static_cast<int32_t>(id));
    }
    hello.hello.kv_blocks = engine.stats().kv_blocks_total;
    hello.hello.kv_layout = {pd::KvModelFingerprint(model), model.config().num_hidden_layers,
                             engine.kv_row_width(), engine.kv_dtype()};
    conn->Send(EncodeEngineMessage(hello), kSendTimeoutSeconds);
  }
  std::unique_ptr<RowSender> row_sender;
  if (conn) row_sender = std::make_unique<RowSender>(*conn);
  bool shutting_down = false, everyone_idle = false;
  int64_t submitted = 0;  // sequences the frontend sent this replica
  runtime::EngineStats reported;
  while (true) {
    std::vector<std::string> frames;
    if (conn) {
      // Wait for work only when no replica has any (a busy replica must not wait on us).
      double wait = everyone_idle && !engine.HasWork() ? kIdleWaitSeconds : 0;
      while (std::optional<std::string> f = conn->Poll(wait)) {
        frames.push_back(std::move(*f));
        wait = 0;
      }
    }
    if (row_sender) row_sender->ThrowIfFailed();
    frames = ShareFrames(tp_comm.get(), o.tp_rank, std::move(frames));
    for (const std::string& f : frames) {
      EngineMessage m = DecodeEngineMessage(f, "the frontend");
      switch (m.kind) {
        case EngineMessage::Kind::kSubmit:
          engine.Add(m.id, std::move(m.params));
          ++submitted;
          break;
        case EngineMessage::Kind::kAbort:
          engine.Abort(m.id);
          break;
        case EngineMessage::Kind::kExportKv: {
          // Every TP rank's cache holds every row: rank 0 answers (staged rows at once; rows
          // left in the cache's blocks are read back here, between steps).
          if (!conn) break;
          EngineMessage rows;
          rows.kind = EngineMessage::Kind::kKvRows;
          rows.id = m.id;
          try {
            rows.kv = engine.ExportHeldKv(m.id, m.device_ok);
            AFD_CHECK(rows.kv->bytes.size() <= kMaxKvAttachmentBytes,
                      "request {}'s KV rows of {} bytes exceed the {} bytes an engine frame "
                      "carries",
                      m.id, rows.kv->bytes.size(), kMaxKvAttachmentBytes);
          } catch (const Error& e) {
            rows.kv.reset();
            rows.why = e.what();
          }
          row_sender->Queue(std::move(rows));
          break;
        }
        case EngineMessage::Kind::kReleaseKv:
          engine.ReleaseHeldKv(m.id);
          break;
        case EngineMessage::Kind::kShutdown:
          shutting_down = true;
          break;
        case EngineMessage::Kind::kRefused:
          AFD_THROW("the frontend refused this replica: {}", m.why);
        default:
          AFD_THROW("the frontend sent an unexpected {} message", EngineMessageKindName(m.kind));
      }
    }
    const bool forward = engine.HasScheduledWork();
    std::vector<runtime::RequestOutput> outputs = engine.Step();
    bool done = false;
    everyone_idle = false;
    if (!forward) {
      const runtime::ReplicaRunner::IdleResult r = runner.Idle(!shutting_down);
      everyone_idle = r == runtime::ReplicaRunner::IdleResult::kNoneBusy;
      done = r == runtime::ReplicaRunner::IdleResult::kShutdown;
    }
    const std::vector<double> round_trips = runner.TakeRoundTrips();
    const runtime::EngineStats stats = engine.stats();
    const bool changed = stats.num_running != reported.num_running ||
                         stats.num_waiting != reported.num_waiting ||
                         stats.kv_blocks_used != reported.kv_blocks_used;
    if (conn && (!outputs.empty() || !round_trips.empty() || changed)) {
      EngineMessage step;
      step.kind = EngineMessage::Kind::kStep;
      step.outputs = std::move(outputs);
      step.stats = stats;
      step.round_trips = Histogram(round_trips);
      conn->Send(EncodeEngineMessage(step), kSendTimeoutSeconds);
      reported = stats;
    }
    if (done) {
      if (o.tp_rank == 0) {
        std::fprintf(stderr, "attention replica %d: served %lld request(s) in %lld step(s); left\n",
                     o.dp_rank, static_cast<long long>(submitted),
                     static_cast<long long>(stats.steps));
      }
      return;
    }
  }
}

}  // namespace afd::deploy

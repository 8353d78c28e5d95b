#include "afd/comm/afd_world.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "afd/comm/join_secret.h"
#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"

namespace afd::comm {

namespace {

constexpr const char* kAbortKey = "join/abort";

std::string Encode(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out;
  for (const auto& [k, v] : fields) out += k + "=" + v + "\n";
  return out;
}

std::vector<std::pair<std::string, std::string>> Decode(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos);
    const size_t eq = line.find('=');
    out.emplace_back(line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1));
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  return out;
}

std::string Label(RoleRank r) { return fmt::format("{} rank {}", RoleName(r.role), r.rank); }

// A group's communicator whose failures name the root cause when another rank -- or world rank
// 0's heartbeat watch -- has reported one: a rank that times out waiting on a healthy peer,
// which itself waits on a stopped one, then says so instead of blaming the healthy peer. After
// a failure it is unusable whatever the transport (NCCL included): every later call fails
// naming the first failure.
class WatchedCommunicator : public Communicator {
 public:
  WatchedCommunicator(std::unique_ptr<Communicator> inner,
                      std::function<void(const Error&)> on_error)
      : inner_(std::move(inner)), on_error_(std::move(on_error)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::string DescribeRank(int rank) const override { return inner_->DescribeRank(rank); }
  void Send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    Watch([&] { inner_->Send(buf, count, dtype, peer, tag); });
  }
  void Recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    Watch([&] { inner_->Recv(buf, count, dtype, peer, tag); });
  }
  void GroupStart() override {
    Watch([&] { inner_->GroupStart(); });
  }
  void GroupEnd() override {
    Watch([&] { inner_->GroupEnd(); });
  }
  bool WaitReadable(int peer, double timeout_s) override {
    bool readable = false;
    Watch([&] { readable = inner_->WaitReadable(peer, timeout_s); });
    return readable;
  }
  void Barrier() override {
    Watch([&] { inner_->Barrier(); });
  }
  void AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    Watch([&] { inner_->AllReduce(buf, count, dtype, op); });
  }
  void AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                 const std::vector<size_t>& recv_counts, DType dtype) override {
    Watch([&] { inner_->AllToAllV(send, send_counts, recv, recv_counts, dtype); });
  }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  template <typename F>
  void Watch(F&& f) {
    AFD_CHECK(broken_.empty(), "group {}: group unusable after an earlier failed operation: {}",
              inner_->name(), broken_);
    try {
      f();
    } catch (const Error& e) {
      broken_ = e.what();
      try {
        on_error_(e);  // throws the explained error, or returns to rethrow the original
      } catch (const Error& explained) {
        broken_ = explained.what();
        throw;
      }
      throw;
    }
  }

  std::unique_ptr<Communicator> inner_;
  std::function<void(const Error&)> on_error_;
  std::string broken_;  // the first failure; empty while the group is usable
};

}  // namespace

std::vector<std::pair<std::string, std::string>> JoinFingerprint(const JoinRequest& r) {
  const AfdConfig& c = r.config;
  std::vector<std::pair<std::string, std::string>> fields = {
      {"host", c.host},
      {"port", std::to_string(c.port)},
      {"num_attention_ranks", std::to_string(c.num_attention_ranks)},
      {"num_ffn_ranks", std::to_string(c.num_ffn_ranks)},
      {"connector", c.connector},
      {"compute_gate_on_attention", c.compute_gate_on_attention ? "true" : "false"},
      {"hidden_size", std::to_string(r.hidden_size)},
      {"dtype", std::string(DTypeName(r.dtype))},
  };
  if (c.is_async()) {
    // The window's layout and the ring's protocol follow from these: every rank must agree.
    // (attn_ranks_per_dp and the micro-batching concern the attention ranks alone; the windows
    // take the deepest ring any rank asks for: async_connector.cpp.)
    const AsyncOptions& o = c.async_options;
    const std::string p = "connector_extra_config.";
    fields.insert(fields.end(),
                  {{p + "routed_cap_multiplier", fmt::format("{}", o.routed_cap_multiplier)},
                   {p + "device_flags", o.device_flags ? "true" : "false"},
                   {p + "window", o.window}});
  }
  fields.insert(fields.end(), r.extra_fields.begin(), r.extra_fields.end());
  return fields;
}

AfdWorld::AfdWorld(JoinRequest request, CommunicatorFactory factory)
    : request_(std::move(request)),
      factory_(std::move(factory)),
      topology_(request_.config.num_attention_ranks, request_.config.num_ffn_ranks),
      world_rank_(-1) {}

// World rank 0 serves the store. After a completed join it stays until every rank has come
// and hung up again, bounded by the timeout, so nobody loses the store while reading a barrier
// or an abort message. After a failed join the same wait is bounded by kFailedJoinLingerSeconds
// instead: enough for ranks starting late to read the abort, short enough to exit promptly.
AfdWorld::~AfdWorld() {
  {
    MutexLock lock(heartbeat_mu_);
    heartbeat_stop_ = true;
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (joined_ && client_) {
    try {  // a rank that leaves on purpose is not a stalled one
      client_->Set(fmt::format("hb_done/{}", world_rank_), "1");
    } catch (const Error&) {
    }
  }
  client_.reset();
  if (!server_) return;
  constexpr double kFailedJoinLingerSeconds = 5.0;
  const double timeout = request_.config.afd_process_group_timeout_s;
  const Deadline deadline =
      Deadline::In(joined_ ? timeout : std::min(timeout, kFailedJoinLingerSeconds));
  while ((server_->num_clients() > 0 || server_->num_accepted() < topology_.world_size()) &&
         !deadline.expired() && !server_->failure()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string AfdWorld::Describe(int world_rank) const {
  const RoleRank r = topology_.RoleOfWorldRank(world_rank);
  return fmt::format("world rank {} ({} {})", world_rank, RoleName(r.role), r.rank);
}

void AfdWorld::Abort(const std::string& message) {
  if (!client_) return;
  try {
    // The first caller wins atomically; later messages are consequences of the first.
    if (client_->Add("join/abort_claim", 1) == 1) client_->Set(kAbortKey, message);
  } catch (const Error&) {
    // The store is gone: the peers notice that on their own.
  }
}

std::optional<std::string> AfdWorld::AbortMessage() {
  if (!client_) return std::nullopt;
  try {
    return client_->TryGet(kAbortKey);
  } catch (const Error&) {
    return std::nullopt;
  }
}

void AfdWorld::CheckAbort() {
  if (server_) {
    if (auto failure = server_->failure()) {
      AFD_THROW("the rendezvous store served by {} failed: {}", Describe(world_rank_), *failure);
    }
  }
  if (auto abort = client_->TryGet(kAbortKey)) AFD_THROW("aborted: {}", *abort);
}

void AfdWorld::Barrier(const std::string& name) {
  const int n = topology_.world_size();
  std::vector<std::string> keys;
  for (int w = 0; w < n; ++w) keys.push_back(fmt::format("barrier/{}/{}", name, w));
  client_->Set(keys[world_rank_], "1");
  const Deadline deadline = Deadline::In(request_.config.afd_process_group_timeout_s);
  int sleep_ms = 1;
  while (true) {
    CheckAbort();
    const std::vector<bool> present = client_->Check(keys);
    std::string missing;
    for (int w = 0; w < n; ++w) {
      if (!present[w]) missing += (missing.empty() ? "" : ", ") + Describe(w);
    }
    if (missing.empty()) return;
    AFD_CHECK(!deadline.expired(), "barrier {}: timed out after {}s waiting for {}", name,
              request_.config.afd_process_group_timeout_s, missing);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 50);
  }
}

std::unique_ptr<AfdWorld> AfdWorld::Join(const JoinRequest& request, CommunicatorFactory factory) {
  ValidateAfdConfig(request.config);
  AFD_CHECK(request.hidden_size >= 1, "join: hidden size must be >= 1, got {}",
            request.hidden_size);
  if (!factory) {
    factory = [](Store& store, const GroupSpec& spec) -> std::unique_ptr<Communicator> {
      return TcpCommunicator::Create(store, spec);
    };
  }
  std::unique_ptr<AfdWorld> w(new AfdWorld(request, std::move(factory)));
  const AfdConfig& c = request.config;
  const double timeout = c.afd_process_group_timeout_s;
  const bool in_range =
      request.role_rank >= 0 &&
      request.role_rank < (c.role == Role::kAttention ? c.num_attention_ranks : c.num_ffn_ranks);
  if (in_range) w->world_rank_ = w->topology_.WorldRank({c.role, request.role_rank});
  const std::optional<std::string> secret = ResolveJoinSecret(c.host);
  w->secret_ = secret;
  if (w->world_rank_ == 0) {
    StoreServerOptions options;
    options.bind_host = ResolveIPv4(c.host);  // the configured address only, never every one
    options.port = c.port;
    options.secret = secret;
    w->server_ = std::make_unique<TcpStoreServer>(std::move(options));
  }
  w->client_ = std::make_unique<TcpStoreClient>(c.host, c.port, timeout, secret);
  if (!in_range) {
    const std::string msg = fmt::format(
        "{} is out of range: num_{}_ranks is {}", Label({c.role, request.role_rank}),
        RoleName(c.role), c.role == Role::kAttention ? c.num_attention_ranks : c.num_ffn_ranks);
    w->Abort(msg);
    AFD_THROW("join: {}", msg);
  }
  w->local_address_ = LocalAddressToward(c.host, c.port);
  w->VerifyJoin();
  w->joined_ = true;
  w->StartHeartbeat();
  return w;
}

void AfdWorld::VerifyJoin() {
  const AfdConfig& c = request_.config;
  const RoleRank me = self();
  const std::string my_key = fmt::format("{}/{}", RoleName(me.role), me.rank);
  // Claim the role rank: a second process with the same one is named and fails.
  const int64_t claims = client_->Add("join/claim/" + my_key, 1);
  if (claims > 1) {
    const std::string msg = fmt::format(
        "duplicate role rank: {} was claimed by another process before this one (address {})",
        Label(me), local_address_);
    Abort(msg);
    AFD_THROW("join: {}", msg);
  }
  const auto mine = JoinFingerprint(request_);
  client_->Set("join/fp/" + my_key, Encode(mine) + "address=" + local_address_ + "\n");

  std::vector<RoleRank> all;
  std::vector<std::string> keys;
  for (int f = 0; f < c.num_ffn_ranks; ++f) all.push_back({Role::kFfn, f});
  for (int a = 0; a < c.num_attention_ranks; ++a) all.push_back({Role::kAttention, a});
  for (const RoleRank& r : all)
    keys.push_back(fmt::format("join/fp/{}/{}", RoleName(r.role), r.rank));
  std::vector<bool> verified(all.size(), false);
  const Deadline deadline = Deadline::In(c.afd_process_group_timeout_s);
  int sleep_ms = 1;
  while (true) {
    if (auto abort = client_->TryGet(kAbortKey)) AFD_THROW("join aborted: {}", *abort);
    const std::vector<bool> present = client_->Check(keys);
    size_t num_verified = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      if (!verified[i] && present[i]) {
        const auto theirs = Decode(client_->TryGet(keys[i]).value_or(""));
        for (size_t f = 0; f < mine.size(); ++f) {
          const std::string their_value = f < theirs.size() ? theirs[f].second : "<missing>";
          if (their_value != mine[f].second) {
            const std::string msg =
                fmt::format("configuration mismatch in field '{}': {} has {}={} but {} has {}={}",
                            mine[f].first, Label(me), mine[f].first, mine[f].second, Label(all[i]),
                            mine[f].first, their_value);
            Abort(msg);
            AFD_THROW("join: {}", msg);
          }
        }
        verified[i] = true;
      }
      num_verified += verified[i];
    }
    if (num_verified == all.size()) return;
    if (deadline.expired()) {
      std::string missing;
      for (size_t i = 0; i < all.size(); ++i) {
        if (!verified[i]) {
          missing += fmt::format("{}{} (world rank {})", missing.empty() ? "" : ", ", Label(all[i]),
                                 topology_.WorldRank(all[i]));
        }
      }
      AFD_THROW("join: timed out after {}s at {}:{}; these ranks never arrived: {}",
                c.afd_process_group_timeout_s, c.host, c.port, missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 50);
  }
}

std::unique_ptr<Communicator> AfdWorld::CreateGroup(const std::string& name,
                                                    const std::vector<int>& members) {
  GroupSpec spec;
  spec.name = name;
  spec.size = static_cast<int>(members.size());
  spec.rank = -1;
  for (int i = 0; i < spec.size; ++i) {
    if (members[i] == world_rank_) spec.rank = i;
    spec.labels.push_back(Describe(members[i]));
  }
  AFD_CHECK(spec.rank >= 0, "group {}: {} is not a member", name, Describe(world_rank_));
  spec.local_address = local_address_;
  spec.timeout_s = request_.config.afd_process_group_timeout_s;
  spec.join_secret = secret_;
  PrefixStore store(*client_, name);
  try {
    return std::make_unique<WatchedCommunicator>(factory_(store, spec),
                                                 [this](const Error& e) { ExplainFailure(e); });
  } catch (const Error& e) {
    // Prefer the root cause another rank reported over our own timeout.
    if (auto abort = client_->TryGet(kAbortKey)) AFD_THROW("group {}: aborted: {}", name, *abort);
    Abort(fmt::format("{} failed to form group {}: {}", Describe(world_rank_), name, e.what()));
    throw;
  }
}

}  // namespace afd::comm

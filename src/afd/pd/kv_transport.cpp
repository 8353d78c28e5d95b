#include "afd/pd/kv_transport.h"

#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::pd {

namespace {

constexpr uint32_t kMagic = 0x4b444641;      // "AFDK"
constexpr uint32_t kMaxFrameBody = 1 << 16;  // frames carry metadata; the rows follow raw
constexpr size_t kNonceBytes = 32;
enum Code : uint8_t {
  kChallenge = 1,
  kAuth = 2,
  kAuthOk = 3,
  kAuthFailed = 4,
  kFetch = 5,
  kRows = 6,
  kFailed = 7,
  kDone = 8,
  kRelease = 9,      // client -> server after the handshake, instead of kFetch: free the rows
  kDeviceRows = 10,  // server -> client: the rows' place in the producer's GPU cache (CUDA IPC)
};
constexpr std::string_view kClientLabel = "afd-kv-v1 client";
constexpr std::string_view kServerLabel = "afd-kv-v1 server";

std::string Mac(const std::string& secret, std::string_view label, std::string_view first,
                std::string_view second) {
  std::string msg(label);
  msg.append(first).append(second);
  return std::string(AsBytes(HmacSha256(secret, msg)));
}

void SendFrame(comm::Socket& s, Code code, const std::vector<std::string>& fields,
               const Deadline& deadline, const std::string& what) {
  std::string body(1, static_cast<char>(code));
  for (const std::string& f : fields) {
    const uint32_t len = static_cast<uint32_t>(f.size());
    body.append(reinterpret_cast<const char*>(&len), 4).append(f);
  }
  const uint32_t header[2] = {kMagic, static_cast<uint32_t>(body.size())};
  s.SendAll(header, sizeof(header), deadline, what);
  s.SendAll(body.data(), body.size(), deadline, what);
}

struct Frame {
  Code code;
  std::vector<std::string> fields;
};

Frame RecvFrame(comm::Socket& s, const Deadline& deadline, const std::string& what) {
  uint32_t header[2];
  s.RecvAll(header, sizeof(header), deadline, what);
  AFD_CHECK(header[0] == kMagic, "{} does not speak the KV transfer protocol (magic {:#010x})",
            what, header[0]);
  AFD_CHECK(header[1] >= 1 && header[1] <= kMaxFrameBody, "{} sent a frame of {} bytes", what,
            header[1]);
  std::string body(header[1], '\0');
  s.RecvAll(body.data(), body.size(), deadline, what);
  Frame f{static_cast<Code>(body[0]), {}};
  size_t pos = 1;
  while (pos < body.size()) {
    AFD_CHECK(body.size() - pos >= 4, "{} sent a malformed frame", what);
    uint32_t len;
    std::memcpy(&len, body.data() + pos, 4);
    pos += 4;
    AFD_CHECK(body.size() - pos >= len, "{} sent a malformed frame", what);
    f.fields.push_back(body.substr(pos, len));
    pos += len;
  }
  return f;
}

// The frame's fields, exactly `n` of them, when it has `code`; a kFailed frame's message is
// thrown as the peer's error.
std::vector<std::string> Expect(Frame f, Code code, size_t n, const std::string& what) {
  if (f.code == kFailed) AFD_THROW("{}: {}", what, f.fields.empty() ? "failed" : f.fields[0]);
  AFD_CHECK(f.code == code && f.fields.size() == n,
            "{} answered out of protocol (frame {} with {} fields, expected {} with {})", what,
            static_cast<int>(f.code), f.fields.size(), static_cast<int>(code), n);
  return std::move(f.fields);
}

int64_t ToInt(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  AFD_THROW("{} sent a malformed number '{}'", what, s);
}

}  // namespace

KvTransferServer::KvTransferServer(const std::string& bind_host, int port,
                                   std::optional<std::string> secret, std::string model,
                                   Provide provide, Release release, double io_timeout_s)
    : secret_(std::move(secret)),
      model_(std::move(model)),
      provide_(std::move(provide)),
      release_(std::move(release)),
      io_timeout_s_(io_timeout_s) {
  AFD_CHECK(io_timeout_s > 0, "KV transfer server: io timeout must be > 0, got {}", io_timeout_s);
  listener_ = comm::Listen(bind_host, port);
  port_ = comm::LocalPort(listener_);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

KvTransferServer::~KvTransferServer() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Connection> connections;
  {
    MutexLock lock(mu_);
    connections.swap(connections_);
  }
  for (Connection& c : connections) c.thread.join();  // each bounded by io_timeout_s
}

void KvTransferServer::AcceptLoop() {
  while (!stop_) {
    pollfd p{listener_.fd(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;  // wakes to check stop_
    comm::Socket s;
    try {
      s = comm::Accept(listener_, Deadline::In(0.1), "a KV transfer client");
    } catch (const Error&) {
      continue;
    }
    MutexLock lock(mu_);
    connections_.remove_if([](Connection& c) {
      if (!c.done) return false;
      c.thread.join();
      return true;
    });
    if (static_cast<int>(connections_.size()) >= kMaxConnections) {
      try {
        SendFrame(s, kFailed, {"the producer serves too many KV transfers at once; retry"},
                  Deadline::In(1.0), "a KV transfer client");
      } catch (const Error&) {
      }
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.thread = std::thread([this, &c, sock = std::move(s)]() mutable {
      Serve(std::move(sock));
      c.done = true;
    });
  }
}

void KvTransferServer::Serve(comm::Socket s) {
  const std::string what = "a KV transfer client";
  try {
    // Handshake.
    const std::string nonce = RandomBytes(kNonceBytes);
    SendFrame(s, kChallenge, {nonce, std::string(1, secret_ ? '\1' : '\0')},
              Deadline::In(io_timeout_s_), what);
    const std::vector<std::string> auth =
        Expect(RecvFrame(s, Deadline::In(io_timeout_s_), what), kAuth, 2, what);
    if (secret_ && !DigestsEqual(auth[1], Mac(*secret_, kClientLabel, nonce, auth[0]))) {
      SendFrame(s, kAuthFailed, {}, Deadline::In(io_timeout_s_), what);
      return;
    }
    SendFrame(s, kAuthOk, {secret_ ? Mac(*secret_, kServerLabel, auth[0], nonce) : ""},
              Deadline::In(io_timeout_s_), what);
    // The fetch (or a release without one: the decode leg will not come).
    const Frame request = RecvFrame(s, Deadline::In(io_timeout_s_), what);
    if (request.code == kRelease) {
      const std::vector<std::string> release = Expect(request, kRelease, 1, what);
      release_(static_cast<uint64_t>(ToInt(release[0], what)));
      SendFrame(s, kDone, {}, Deadline::In(io_timeout_s_), what);
      return;
    }
    // A third field: the consumer reads GPU rows over CUDA IPC from a host it names.
    const std::vector<std::string> fetch =
        Expect(request, kFetch, request.fields.size() == 3 ? 3 : 2, what);
    const uint64_t id = static_cast<uint64_t>(ToInt(fetch[0], what));
    const bool device_ok = fetch.size() == 3 && fetch[2] == KvHostId();
    if (fetch[1] != model_) {
      SendFrame(
          s, kFailed,
          {fmt::format("the producer serves model '{}', the consumer '{}'", model_, fetch[1])},
          Deadline::In(io_timeout_s_), what);
      return;
    }
    std::shared_ptr<const runtime::KvRows> held;
    try {
      held = provide_(id, device_ok);
      AFD_CHECK(held != nullptr, "request {} holds no KV rows", id);
    } catch (const std::exception& e) {  // afd::Error, or the engine going away (future_error)
      SendFrame(s, kFailed, {e.what()}, Deadline::In(io_timeout_s_), what);
      return;
    }
    const runtime::KvRows& rows = *held;
    if (const std::optional<runtime::KvDeviceRows>& d = rows.device) {
      if (d->blocks.size() * 4 + 1024 > kMaxFrameBody) {
        SendFrame(s, kFailed,
                  {fmt::format("request {}'s {} blocks do not fit one frame of the CUDA IPC "
                               "description; use the tcp transport",
                               id, d->blocks.size())},
                  Deadline::In(io_timeout_s_), what);
        return;
      }
      std::string blocks;
      for (const int32_t b : d->blocks) blocks.append(reinterpret_cast<const char*>(&b), 4);
      SendFrame(s, kDeviceRows,
                {std::to_string(rows.num_layers), std::to_string(rows.row_width),
                 std::string(DTypeName(rows.dtype)), std::to_string(rows.positions), d->ipc_handle,
                 std::to_string(d->num_slots), std::to_string(d->block_size), blocks},
                Deadline::In(io_timeout_s_), what);
      ++transfers_done_;
      ++device_transfers_;
      return;  // held until the consumer's release (or the hold timeout)
    }
    SendFrame(s, kRows,
              {std::to_string(rows.num_layers), std::to_string(rows.row_width),
               std::string(DTypeName(rows.dtype)), std::to_string(rows.positions),
               std::to_string(rows.bytes.size())},
              Deadline::In(io_timeout_s_), what);
    s.SendAll(rows.bytes.data(), rows.bytes.size(), Deadline::In(io_timeout_s_), what);
    Expect(RecvFrame(s, Deadline::In(io_timeout_s_), what), kDone, 0, what);
    release_(id);
    ++transfers_done_;
  } catch (const std::exception&) {
    // The client went away or broke the protocol (or the engine did): its rows stay held (until
    // the hold timeout or a retry).
  }
}

std::string KvModelFingerprint(const model::MoeModel& model) {
  const model::ModelConfig& c = model.config();
  return fmt::format("{} layers {} hidden {} heads {} vocab {} experts {} top {} cache rows {} {}",
                     c.model_type_name(), c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                     c.vocab_size, c.n_routed_experts, c.num_experts_per_tok, c.cache_row_width(),
                     DTypeName(model.kv_cache_dtype()));
}

namespace {

// The client's side of the handshake: a connection to the producer at host:port whose secret
// both sides proved.
comm::Socket ConnectToProducer(const std::string& host, int port,
                               const std::optional<std::string>& secret, const Deadline& deadline,
                               const std::string& what) {
  // Connect names the address itself ("... the KV producer at host:port"): once.
  comm::Socket s = comm::Connect(host, port, deadline, "the KV producer");
  const std::vector<std::string> challenge =
      Expect(RecvFrame(s, deadline, what), kChallenge, 2, what);
  const bool wants_secret = challenge[1] == std::string(1, '\1');
  AFD_CHECK(!wants_secret || secret,
            "{} requires the join secret (AFD_JOIN_SECRET / AFD_JOIN_SECRET_FILE), this process "
            "has none",
            what);
  const std::string nonce = RandomBytes(kNonceBytes);
  SendFrame(s, kAuth, {nonce, secret ? Mac(*secret, kClientLabel, challenge[0], nonce) : ""},
            deadline, what);
  const Frame reply = RecvFrame(s, deadline, what);
  AFD_CHECK(reply.code != kAuthFailed,
            "{} refused this process's join secret (the two sides have different secrets)", what);
  const std::vector<std::string> ok = Expect(reply, kAuthOk, 1, what);
  if (secret && wants_secret) {
    AFD_CHECK(DigestsEqual(ok[0], Mac(*secret, kServerLabel, nonce, challenge[0])),
              "{} did not prove it holds the join secret", what);
  }
  return s;
}

}  // namespace

const std::string& KvHostId() {
  static const std::string id = [] {
    std::string boot = "unknown";
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char buf[64] = {};
      if (std::fgets(buf, sizeof(buf), f)) boot = buf;
      std::fclose(f);
    }
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    return boot + " " + host;
  }();
  return id;
}

runtime::KvRows FetchKvRows(const std::string& host, int port, uint64_t request_id,
                            const runtime::KvLayout& expect,
                            const std::optional<std::string>& secret, double timeout_s,
                            bool accept_device) {
  const std::string what = fmt::format("the KV producer at {}:{}", host, port);
  const Deadline deadline = Deadline::In(timeout_s);
  comm::Socket s = ConnectToProducer(host, port, secret, deadline, what);
  std::vector<std::string> fetch = {std::to_string(request_id), expect.model};
  if (accept_device) fetch.push_back(KvHostId());
  SendFrame(s, kFetch, fetch, deadline, what);
  Frame reply = RecvFrame(s, deadline, what);
  const bool device = accept_device && reply.code == kDeviceRows;
  const std::vector<std::string> head = device ? Expect(std::move(reply), kDeviceRows, 8, what)
                                               : Expect(std::move(reply), kRows, 5, what);
  runtime::KvRows rows;
  rows.num_layers = ToInt(head[0], what);
  rows.row_width = ToInt(head[1], what);
  const std::string dtype = head[2];
  rows.positions = ToInt(head[3], what);
  AFD_CHECK(rows.num_layers == expect.num_layers && rows.row_width == expect.row_width &&
                dtype == DTypeName(expect.dtype),
            "{} holds {} layers of {}-wide {} rows, this instance's cache has {} layers of "
            "{}-wide {} rows",
            what, rows.num_layers, rows.row_width, dtype, expect.num_layers, expect.row_width,
            DTypeName(expect.dtype));
  rows.dtype = expect.dtype;
  AFD_CHECK(rows.positions >= 0, "{} announced {} positions", what, rows.positions);
  if (device) {
    runtime::KvDeviceRows& d = rows.device.emplace();
    d.ipc_handle = head[4];
    d.num_slots = ToInt(head[5], what);
    d.block_size = ToInt(head[6], what);
    AFD_CHECK(head[7].size() % 4 == 0, "{} sent a malformed block list", what);
    d.blocks.resize(head[7].size() / 4);
    std::memcpy(d.blocks.data(), head[7].data(), head[7].size());
    return rows;  // the engine checks the blocks against the slots before it reads them
  }
  const int64_t bytes = ToInt(head[4], what);
  AFD_CHECK(bytes == rows.expected_bytes(), "{} announced {} bytes for {} positions (expected {})",
            what, bytes, rows.positions, rows.expected_bytes());
  rows.bytes.resize(bytes);
  s.RecvAll(rows.bytes.data(), rows.bytes.size(), deadline, what);
  SendFrame(s, kDone, {}, deadline, what);
  return rows;
}

void ReleaseKvRows(const std::string& host, int port, uint64_t request_id,
                   const std::optional<std::string>& secret, double timeout_s) {
  const std::string what = fmt::format("the KV producer at {}:{}", host, port);
  const Deadline deadline = Deadline::In(timeout_s);
  comm::Socket s = ConnectToProducer(host, port, secret, deadline, what);
  SendFrame(s, kRelease, {std::to_string(request_id)}, deadline, what);
  Expect(RecvFrame(s, deadline, what), kDone, 0, what);
}

}  // namespace afd::pd

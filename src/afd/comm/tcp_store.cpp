// TcpStoreClient and TcpStoreServer. Frame format (little-endian, docs/wire_formats.md):
//   request:  u32 magic 'AFDS' | u32 body_len | u8 op | fields
//   response: u32 magic 'AFDS' | u32 body_len | u8 status | fields
//   field:    u32 len | len bytes
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "afd/comm/store.h"
#include "afd/common/error.h"

namespace afd::comm {

namespace {

constexpr uint32_t kStoreMagic = 0x53444641;  // "AFDS"
constexpr uint32_t kMaxBody = 64u << 20;      // no store value is anywhere near 64 MiB

enum StoreOp : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kDelete = 4, kCheck = 5 };
enum StoreStatus : uint8_t { kOk = 0, kMissing = 1, kBadRequest = 2 };

struct FrameHeader {
  uint32_t magic;
  uint32_t body_len;
};
static_assert(sizeof(FrameHeader) == 8, "store frame header is 8 bytes on the wire");

void PutField(std::string& out, const std::string& field) {
  const uint32_t len = static_cast<uint32_t>(field.size());
  out.append(reinterpret_cast<const char*>(&len), 4);
  out += field;
}

// Splits a body into fields; returns false when malformed.
bool ParseFields(const std::string& body, size_t pos, std::vector<std::string>& fields) {
  while (pos < body.size()) {
    if (body.size() - pos < 4) return false;
    uint32_t len;
    std::memcpy(&len, body.data() + pos, 4);
    pos += 4;
    if (body.size() - pos < len) return false;
    fields.emplace_back(body.substr(pos, len));
    pos += len;
  }
  return true;
}

std::string Frame(uint8_t code, const std::vector<std::string>& fields) {
  std::string body(1, static_cast<char>(code));
  for (const auto& f : fields) PutField(body, f);
  FrameHeader h{kStoreMagic, static_cast<uint32_t>(body.size())};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + body;
}

std::string EncodeI64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
int64_t DecodeI64(const std::string& s) {
  int64_t v = 0;
  if (s.size() == 8) std::memcpy(&v, s.data(), 8);
  return v;
}

}  // namespace

// ---- Client ------------------------------------------------------------------------------

TcpStoreClient::TcpStoreClient(const std::string& host, int port, double timeout_s)
    : where_(fmt::format("rendezvous store at {}:{}", host, port)), timeout_s_(timeout_s) {
  socket_ = Connect(host, port, Deadline::In(timeout_s),
                    where_ + " (served by FFN rank 0; is it running?)");
}

std::string TcpStoreClient::Request(uint8_t op, const std::vector<std::string>& fields) {
  std::lock_guard<std::mutex> lock(mu_);
  AFD_CHECK(socket_.valid(), "{}: the connection was lost earlier", where_);
  const Deadline deadline = Deadline::In(timeout_s_);
  try {
    const std::string frame = Frame(op, fields);
    socket_.SendAll(frame.data(), frame.size(), deadline, where_);
    FrameHeader h;
    socket_.RecvAll(&h, sizeof(h), deadline, where_);
    AFD_CHECK(h.magic == kStoreMagic && h.body_len >= 1 && h.body_len <= kMaxBody,
              "{} sent a malformed response (is something else listening on that port?)", where_);
    std::string body(h.body_len, '\0');
    socket_.RecvAll(body.data(), body.size(), deadline, where_);
    return body;
  } catch (const Error&) {
    socket_.Close();  // the stream is out of sync now; later requests fail fast
    throw;
  }
}

void TcpStoreClient::Set(const std::string& key, const std::string& value) {
  const std::string r = Request(kSet, {key, value});
  AFD_CHECK(r[0] == kOk, "{}: set {} failed", where_, key);
}

std::optional<std::string> TcpStoreClient::TryGet(const std::string& key) {
  const std::string r = Request(kGet, {key});
  if (r[0] == kMissing) return std::nullopt;
  std::vector<std::string> f;
  AFD_CHECK(r[0] == kOk && ParseFields(r, 1, f) && f.size() == 1, "{}: get {} failed", where_, key);
  return f[0];
}

int64_t TcpStoreClient::Add(const std::string& key, int64_t delta) {
  const std::string r = Request(kAdd, {key, EncodeI64(delta)});
  std::vector<std::string> f;
  AFD_CHECK(r[0] == kOk && ParseFields(r, 1, f) && f.size() == 1,
            "{}: add {} failed (is the key a counter?)", where_, key);
  return DecodeI64(f[0]);
}

bool TcpStoreClient::Delete(const std::string& key) { return Request(kDelete, {key})[0] == kOk; }

std::vector<bool> TcpStoreClient::Check(const std::vector<std::string>& keys) {
  const std::string r = Request(kCheck, keys);
  std::vector<std::string> f;
  AFD_CHECK(r[0] == kOk && ParseFields(r, 1, f) && f.size() == 1 && f[0].size() == keys.size(),
            "{}: check failed", where_);
  std::vector<bool> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = f[0][i] != 0;
  return out;
}

// ---- Server ------------------------------------------------------------------------------

TcpStoreServer::TcpStoreServer(int port) {
  listener_ = Listen("", port);
  port_ = LocalPort(listener_);
  AFD_CHECK(pipe2(wake_fd_, O_CLOEXEC) == 0, "pipe failed: {}", std::strerror(errno));
  thread_ = std::thread([this] { Serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  if (wake_fd_[1] >= 0) {
    const char c = 'x';
    [[maybe_unused]] ssize_t n = write(wake_fd_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : wake_fd_) {
    if (fd >= 0) close(fd);
  }
}

void TcpStoreServer::Serve() {
  struct Client {
    Socket socket;
    std::string in;
  };
  std::map<std::string, std::string> data;
  std::vector<Client> clients;
  auto handle = [&data](const std::string& body) -> std::string {
    std::vector<std::string> f;
    if (body.empty() || !ParseFields(body, 1, f)) return Frame(kBadRequest, {});
    switch (static_cast<uint8_t>(body[0])) {
      case kSet:
        if (f.size() != 2) break;
        data[f[0]] = f[1];
        return Frame(kOk, {});
      case kGet: {
        if (f.size() != 1) break;
        auto it = data.find(f[0]);
        return it == data.end() ? Frame(kMissing, {}) : Frame(kOk, {it->second});
      }
      case kAdd: {
        if (f.size() != 2 || f[1].size() != 8) break;
        auto it = data.find(f[0]);
        if (it != data.end() && it->second.size() != 8) break;
        const int64_t v = (it == data.end() ? 0 : DecodeI64(it->second)) + DecodeI64(f[1]);
        data[f[0]] = EncodeI64(v);
        return Frame(kOk, {EncodeI64(v)});
      }
      case kDelete:
        if (f.size() != 1) break;
        return Frame(data.erase(f[0]) ? kOk : kMissing, {});
      case kCheck: {
        std::string bits(f.size(), '\0');
        for (size_t i = 0; i < f.size(); ++i) bits[i] = data.count(f[i]) ? 1 : 0;
        return Frame(kOk, {bits});
      }
    }
    return Frame(kBadRequest, {});
  };

  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (auto& c : clients) fds.push_back({c.socket.fd(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    const size_t polled = clients.size();  // fds[2 + i] belongs to clients[i], i < polled
    if (fds[1].revents & POLLIN) {
      try {
        clients.push_back({Accept(listener_, Deadline::In(0), "store client"), {}});
        ++num_accepted_;
      } catch (const Error&) {
        // A client that went away between poll and accept.
      }
    }
    for (size_t i = 0; i < polled; ++i) {
      if (!(fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Client& c = clients[i];
      bool drop = false;
      try {
        char buf[65536];
        const size_t n = c.socket.RecvSome(buf, sizeof(buf), "store client");
        c.in.append(buf, n);
        while (c.in.size() >= sizeof(FrameHeader)) {
          FrameHeader h;
          std::memcpy(&h, c.in.data(), sizeof(h));
          if (h.magic != kStoreMagic || h.body_len > kMaxBody) {
            drop = true;  // not our protocol
            break;
          }
          if (c.in.size() < sizeof(h) + h.body_len) break;
          const std::string reply = handle(c.in.substr(sizeof(h), h.body_len));
          c.in.erase(0, sizeof(h) + h.body_len);
          c.socket.SendAll(reply.data(), reply.size(), Deadline::In(10), "store client");
        }
      } catch (const Error&) {
        drop = true;  // the client closed its connection or stalled
      }
      if (drop) c.socket.Close();
    }
    std::erase_if(clients, [](const Client& c) { return !c.socket.valid(); });
    num_clients_.store(static_cast<int>(clients.size()));
  }
}

}  // namespace afd::comm

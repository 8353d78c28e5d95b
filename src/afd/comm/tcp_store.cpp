// TcpStoreClient over the protocol of store_protocol.h (docs/wire_formats.md, "Rendezvous
// store"). The server is store_server.cpp.

#include "afd/comm/store.h"
#include "afd/comm/store_protocol.h"
#include "afd/common/error.h"
#include "afd/common/sha256.h"
#include "afd/common/thread_annotations.h"

namespace afd::comm {

using namespace store_wire;

TcpStoreClient::TcpStoreClient(const std::string& host, int port, double timeout_s,
                               std::optional<std::string> secret)
    : where_(fmt::format("rendezvous store at {}:{} (served by the deployment's first rank: FFN "
                         "rank 0 of AFD)",
                         host, port)),
      timeout_s_(timeout_s) {
  const Deadline deadline = Deadline::In(timeout_s);
  MutexLock lock(mu_);  // no other thread yet: for the analysis (socket_ is guarded by mu_)
  socket_ = Connect(host, port, deadline, where_ + " -- is it running?");
  try {
    const std::string challenge = ReadFrame(deadline, kMaxHandshakeBody);
    const std::string client_nonce = RandomBytes(kNonceBytes);
    std::string server_nonce;
    const std::string auth =
        AnswerChallenge(challenge, secret, client_nonce, &server_nonce, where_);
    socket_.SendAll(auth.data(), auth.size(), deadline, where_);
    CheckAuthReply(ReadFrame(deadline, kMaxHandshakeBody), secret, server_nonce, client_nonce,
                   where_);
  } catch (const Error&) {
    socket_.Close();
    throw;
  }
}

std::string TcpStoreClient::ReadFrame(const Deadline& deadline, uint32_t max_body) {
  FrameHeader h;
  socket_.RecvAll(&h, sizeof(h), deadline, where_);
  AFD_CHECK(h.magic == kMagic && h.body_len >= 1 && h.body_len <= max_body,
            "{} sent a malformed frame (magic {:#010x}, {} bytes; is something else listening on "
            "that port?)",
            where_, h.magic, h.body_len);
  std::string body(h.body_len, '\0');
  socket_.RecvAll(body.data(), body.size(), deadline, where_);
  return body;
}

std::string TcpStoreClient::Request(uint8_t op, const std::vector<std::string>& fields) {
  MutexLock lock(mu_);
  AFD_CHECK(socket_.valid(), "{}: the connection was lost earlier", where_);
  const Deadline deadline = Deadline::In(timeout_s_);
  try {
    const std::string frame = Frame(op, fields);
    socket_.SendAll(frame.data(), frame.size(), deadline, where_);
    return ReadFrame(deadline, kMaxBody);
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
  AFD_CHECK(r[0] == kOk && ParseFields(r, 1, f) && f.size() == 1 && f[0].size() == 8,
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

}  // namespace afd::comm

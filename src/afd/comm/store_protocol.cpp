#include "afd/comm/store_protocol.h"

#include <cstring>

#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::comm::store_wire {

namespace {
constexpr std::string_view kClientLabel = "afd-store-v1 client";
constexpr std::string_view kServerLabel = "afd-store-v1 server";
}  // namespace

std::string Frame(uint8_t code, const std::vector<std::string>& fields) {
  std::string body(1, static_cast<char>(code));
  for (const auto& f : fields) {
    const uint32_t len = static_cast<uint32_t>(f.size());
    body.append(reinterpret_cast<const char*>(&len), 4);
    body += f;
  }
  const FrameHeader h{kMagic, static_cast<uint32_t>(body.size())};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + body;
}

bool ParseFields(std::string_view body, size_t pos, std::vector<std::string>& fields) {
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

std::string EncodeI64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

int64_t DecodeI64(std::string_view s) {
  int64_t v = 0;
  if (s.size() == 8) std::memcpy(&v, s.data(), 8);
  return v;
}

std::optional<size_t> FrameLength(std::string_view in, uint32_t max_body) {
  if (in.size() < sizeof(FrameHeader)) return std::nullopt;
  FrameHeader h;
  std::memcpy(&h, in.data(), sizeof(h));
  AFD_CHECK(h.magic == kMagic, "not the store protocol (frame magic {:#010x}, expected {:#010x})",
            h.magic, kMagic);
  AFD_CHECK(h.body_len >= 1, "empty frame body (no op or status byte)");
  AFD_CHECK(h.body_len <= max_body, "frame body of {} bytes exceeds the limit of {} bytes",
            h.body_len, max_body);
  if (in.size() - sizeof(h) < h.body_len) return std::nullopt;
  return sizeof(h) + h.body_len;
}

std::string ClientMac(std::string_view secret, std::string_view server_nonce,
                      std::string_view client_nonce) {
  std::string msg(kClientLabel);
  msg.append(server_nonce).append(client_nonce);
  return std::string(AsBytes(HmacSha256(secret, msg)));
}

std::string ServerMac(std::string_view secret, std::string_view server_nonce,
                      std::string_view client_nonce) {
  std::string msg(kServerLabel);
  msg.append(client_nonce).append(server_nonce);
  return std::string(AsBytes(HmacSha256(secret, msg)));
}

StoreSession::StoreSession(StoreData& data, std::optional<std::string> secret,
                           std::string server_nonce)
    : data_(data), secret_(std::move(secret)), server_nonce_(std::move(server_nonce)) {}

std::string StoreSession::Greeting() const {
  return Frame(kChallenge, {server_nonce_, std::string(1, secret_ ? '\1' : '\0')});
}

void StoreSession::Consume(std::string& in, std::string& out, size_t max_out) {
  size_t pos = 0;
  while (out.size() < max_out) {
    const std::optional<size_t> len = FrameLength(std::string_view(in).substr(pos), max_body());
    if (!len) break;
    const std::string_view body =
        std::string_view(in).substr(pos + sizeof(FrameHeader), *len - sizeof(FrameHeader));
    pos += *len;
    if (!authenticated_) {
      std::vector<std::string> f;
      AFD_CHECK(static_cast<uint8_t>(body[0]) == kAuth, "sent request op {} before authenticating",
                static_cast<int>(body[0]));
      AFD_CHECK(ParseFields(body, 1, f) && f.size() == 2 && f[0].size() == kNonceBytes,
                "sent a malformed authentication request");
      if (secret_ && !DigestsEqual(f[1], ClientMac(*secret_, server_nonce_, f[0]))) {
        out += Frame(kAuthFailed, {});
        in.erase(0, pos);
        AFD_THROW("failed authentication (wrong or missing join secret)");
      }
      authenticated_ = true;
      out += Frame(kOk, {secret_ ? ServerMac(*secret_, server_nonce_, f[0]) : std::string()});
      continue;
    }
    out += Handle(body);
  }
  in.erase(0, pos);
}

std::string StoreSession::Handle(std::string_view body) {
  std::vector<std::string> f;
  if (!ParseFields(body, 1, f)) return Frame(kBadRequest, {});
  switch (static_cast<uint8_t>(body[0])) {
    case kSet:
      if (f.size() != 2) break;
      data_[f[0]] = f[1];
      return Frame(kOk, {});
    case kGet: {
      if (f.size() != 1) break;
      auto it = data_.find(f[0]);
      return it == data_.end() ? Frame(kMissing, {}) : Frame(kOk, {it->second});
    }
    case kAdd: {
      if (f.size() != 2 || f[1].size() != 8) break;
      auto it = data_.find(f[0]);
      if (it != data_.end() && it->second.size() != 8) break;
      // Wrapping add: a counter that overflows wraps instead of being undefined behaviour.
      const uint64_t v = static_cast<uint64_t>(it == data_.end() ? 0 : DecodeI64(it->second)) +
                         static_cast<uint64_t>(DecodeI64(f[1]));
      data_[f[0]] = EncodeI64(static_cast<int64_t>(v));
      return Frame(kOk, {EncodeI64(static_cast<int64_t>(v))});
    }
    case kDelete:
      if (f.size() != 1) break;
      return Frame(data_.erase(f[0]) ? kOk : kMissing, {});
    case kCheck: {
      std::string bits(f.size(), '\0');
      for (size_t i = 0; i < f.size(); ++i) bits[i] = data_.count(f[i]) ? 1 : 0;
      return Frame(kOk, {bits});
    }
  }
  return Frame(kBadRequest, {});
}

std::string AnswerChallenge(std::string_view challenge_body,
                            const std::optional<std::string>& secret,
                            const std::string& client_nonce, std::string* server_nonce,
                            const std::string& where) {
  std::vector<std::string> f;
  AFD_CHECK(!challenge_body.empty() && static_cast<uint8_t>(challenge_body[0]) == kChallenge &&
                ParseFields(challenge_body, 1, f) && f.size() == 2 && f[0].size() == kNonceBytes &&
                f[1].size() == 1,
            "{} sent a malformed greeting (is something else listening on that port, or an "
            "older afd?)",
            where);
  const bool required = f[1][0] == 1;
  AFD_CHECK(!required || secret.has_value(),
            "{} requires a join secret and this process has none: set the deployment's secret "
            "through AFD_JOIN_SECRET or AFD_JOIN_SECRET_FILE",
            where);
  AFD_CHECK(required || !secret.has_value(),
            "{} runs without a join secret but this process has one: start FFN rank 0 with the "
            "same AFD_JOIN_SECRET / AFD_JOIN_SECRET_FILE",
            where);
  *server_nonce = f[0];
  return Frame(kAuth, {client_nonce, secret ? ClientMac(*secret, f[0], client_nonce) : ""});
}

void CheckAuthReply(std::string_view reply_body, const std::optional<std::string>& secret,
                    std::string_view server_nonce, std::string_view client_nonce,
                    const std::string& where) {
  AFD_CHECK(reply_body.empty() || static_cast<uint8_t>(reply_body[0]) != kAuthFailed,
            "{} rejected this process's join secret (the processes of the deployment have "
            "different secrets)",
            where);
  std::vector<std::string> f;
  AFD_CHECK(!reply_body.empty() && static_cast<uint8_t>(reply_body[0]) == kOk &&
                ParseFields(reply_body, 1, f) && f.size() == 1,
            "{} sent a malformed reply to authentication", where);
  if (secret) {
    AFD_CHECK(DigestsEqual(f[0], ServerMac(*secret, server_nonce, client_nonce)),
              "{} could not prove it knows the join secret (an impostor on that address?)", where);
  }
}

}  // namespace afd::comm::store_wire

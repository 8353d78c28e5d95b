// The rendezvous store's wire protocol without sockets (docs/wire_formats.md, "Rendezvous
// store"): frame encoding, the server side of one connection as a byte-in/byte-out state machine
// (StoreSession, also the fuzz target's entry point), and the client's half of the handshake.
//
//   frame:    u32 magic 'AFDS' | u32 body_len | body
//   request:  body = u8 op | fields        response: body = u8 status | fields
//   field:    u32 len | len bytes
//
// Handshake (every connection, before any key is read or written): the server greets with a
// CHALLENGE frame [server_nonce (32 bytes), mode (1 byte: 1 = join secret required)]; the
// client answers AUTH [client_nonce (32), mac]; mac = HMAC-SHA256(secret, "afd-store-v1 client"
// | server_nonce | client_nonce), empty when the store runs without a secret. The server
// answers OK [server_mac = HMAC-SHA256(secret, "afd-store-v1 server" | client_nonce |
// server_nonce)] -- so the client knows it reached the real store -- or AUTH_FAILED and closes.
//
// Thread safety: StoreSession is used by one thread at a time; StoreData belongs to its server.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace afd::comm::store_wire {

inline constexpr uint32_t kMagic = 0x53444641;      // "AFDS"
inline constexpr uint32_t kMaxBody = 64u << 20;     // no store value is anywhere near 64 MiB
inline constexpr uint32_t kMaxHandshakeBody = 256;  // a frame before authentication
inline constexpr size_t kNonceBytes = 32;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kDelete = 4, kCheck = 5, kAuth = 6 };
enum Status : uint8_t { kOk = 0, kMissing = 1, kBadRequest = 2, kChallenge = 3, kAuthFailed = 4 };

struct FrameHeader {
  uint32_t magic;
  uint32_t body_len;
};
static_assert(sizeof(FrameHeader) == 8, "store frame header is 8 bytes on the wire");

std::string Frame(uint8_t code, const std::vector<std::string>& fields);
// Splits body[pos..] into fields; false when malformed.
bool ParseFields(std::string_view body, size_t pos, std::vector<std::string>& fields);
std::string EncodeI64(int64_t v);
int64_t DecodeI64(std::string_view s);

// Looks at the front of `in`: nullopt while the frame is incomplete; otherwise the frame's total
// length. Throws afd::Error describing the problem (bad magic, body too long, empty body) when
// the bytes cannot be a frame of at most max_body bytes.
std::optional<size_t> FrameLength(std::string_view in, uint32_t max_body);

std::string ClientMac(std::string_view secret, std::string_view server_nonce,
                      std::string_view client_nonce);
std::string ServerMac(std::string_view secret, std::string_view server_nonce,
                      std::string_view client_nonce);

using StoreData = std::map<std::string, std::string>;

// Server side of one connection.
class StoreSession {
 public:
  // `secret`: nullopt runs the store open (any client authenticates). `server_nonce` has
  // kNonceBytes bytes.
  StoreSession(StoreData& data, std::optional<std::string> secret, std::string server_nonce);

  // The CHALLENGE frame to send as soon as the connection is accepted.
  std::string Greeting() const;

  // Consumes the complete frames at the front of `in` (removing them) and appends the replies to
  // `out`, stopping early once `out` holds max_out bytes. Throws afd::Error with the reason the
  // connection must be dropped (garbage, a request before authentication, a wrong secret --
  // then `out` already holds the AUTH_FAILED reply, worth trying to send).
  void Consume(std::string& in, std::string& out, size_t max_out = 4u << 20);

  bool authenticated() const { return authenticated_; }
  uint32_t max_body() const { return authenticated_ ? kMaxBody : kMaxHandshakeBody; }

 private:
  std::string Handle(std::string_view body);

  StoreData& data_;
  std::optional<std::string> secret_;
  std::string server_nonce_;
  bool authenticated_ = false;
};

// Client half of the handshake: given the CHALLENGE body, returns the AUTH request frame.
// Throws afd::Error naming `where` when the challenge is malformed or the secrets cannot match
// (the store requires one and this process has none, or the reverse). `client_nonce` has
// kNonceBytes bytes.
std::string AnswerChallenge(std::string_view challenge_body,
                            const std::optional<std::string>& secret,
                            const std::string& client_nonce, std::string* server_nonce,
                            const std::string& where);
// Checks the store's reply to AUTH. Throws afd::Error naming `where` on AUTH_FAILED (wrong
// secret) or when the store could not prove it knows the secret.
void CheckAuthReply(std::string_view reply_body, const std::optional<std::string>& secret,
                    std::string_view server_nonce, std::string_view client_nonce,
                    const std::string& where);

}  // namespace afd::comm::store_wire

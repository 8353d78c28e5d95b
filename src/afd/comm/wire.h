// Wire format of the host transport (TcpCommunicator). Little-endian; documented in
// docs/wire_formats.md. Every message on a connection is a MessageHeader followed by `bytes`
// payload bytes. The connection handshake: a HelloHeader from the connecting rank, a nonce from
// the accepting one, then the connecting rank's HelloProof of the join secret.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace afd::comm {

inline constexpr uint32_t kMessageMagic = 0x4D444641;  // "AFDM"
inline constexpr uint32_t kHelloMagic = 0x48444641;    // "AFDH"
// 2: the hello is answered by a nonce and proven with the join secret (HelloProof).
inline constexpr uint16_t kWireVersion = 2;
inline constexpr size_t kHelloNonceBytes = 32;

struct MessageHeader {
  uint32_t magic;    // kMessageMagic
  uint16_t version;  // kWireVersion
  uint8_t dtype;     // afd::DType
  uint8_t reserved0;
  uint32_t tag;  // caller's tag (connector: layer/stage), or a reserved collective tag
  uint32_t reserved1;
  uint64_t bytes;  // payload size
  uint64_t seq;    // per (sender, receiver) message counter, starting at 0
};
static_assert(sizeof(MessageHeader) == 32, "MessageHeader is 32 bytes on the wire");

struct HelloHeader {
  uint32_t magic;    // kHelloMagic
  uint16_t version;  // kWireVersion
  uint16_t reserved;
  uint32_t group_hash;  // FNV-1a of the group name: a connection to the wrong group is refused
  int32_t rank;         // the connecting rank inside the group
};
static_assert(sizeof(HelloHeader) == 16, "HelloHeader is 16 bytes on the wire");

// FNV-1a, 32 bit.
constexpr uint32_t HashName(const char* s) {
  uint32_t h = 2166136261u;
  for (; *s; ++s) h = (h ^ static_cast<uint8_t>(*s)) * 16777619u;
  return h;
}

// What a receiver expects of the next message from one peer.
struct ExpectedMessage {
  uint64_t seq;
  uint32_t tag;
  uint8_t dtype;
  uint64_t bytes;
};

// Throws afd::Error naming `from` (the sending peer) unless `h` is a well-formed header (magic,
// version, zero reserved fields) carrying exactly what the receiver expects.
void ValidateMessageHeader(const MessageHeader& h, const ExpectedMessage& expected,
                           const std::string& from);

// What a connecting rank sends after the acceptor's nonce: HMAC-SHA256(secret, "afd-group-v1" |
// group | '\0' | rank (4 bytes, little-endian) | nonce), or 32 zero bytes in a deployment
// without a join secret. Binds the proof to the group, the claimed rank and this connection.
std::string HelloProof(const std::optional<std::string>& secret, const std::string& group,
                       int32_t rank, std::string_view nonce);

// Throws afd::Error describing the problem unless `h` is a well-formed hello of the group with
// hash `group_hash` from a rank in [min_rank, size).
void ValidateHello(const HelloHeader& h, uint32_t group_hash, int min_rank, int size);

}  // namespace afd::comm

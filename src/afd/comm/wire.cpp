#include "afd/comm/wire.h"

#include "afd/common/dtype.h"
#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::comm {

void ValidateMessageHeader(const MessageHeader& h, const ExpectedMessage& expected,
                           const std::string& from) {
  AFD_CHECK(
      h.magic == kMessageMagic && h.version == kWireVersion,
      "{} sent a corrupt message header (magic {:#x}, version {}; expected {:#x}, version {})",
      from, h.magic, h.version, kMessageMagic, kWireVersion);
  AFD_CHECK(h.reserved0 == 0 && h.reserved1 == 0,
            "{} sent a corrupt message header (reserved fields {:#x}, {:#x} are not zero)", from,
            h.reserved0, h.reserved1);
  AFD_CHECK(h.seq == expected.seq, "{}: message {} arrived where message {} was expected", from,
            h.seq, expected.seq);
  AFD_CHECK(h.tag == expected.tag && h.dtype == expected.dtype && h.bytes == expected.bytes,
            "{} sent tag {:#x}, {} bytes of {} but this rank expected tag {:#x}, {} bytes of {} "
            "(the ranks disagree on the step's shapes)",
            from, h.tag, h.bytes, DTypeName(static_cast<DType>(h.dtype)), expected.tag,
            expected.bytes, DTypeName(static_cast<DType>(expected.dtype)));
}

std::string HelloProof(const std::optional<std::string>& secret, const std::string& group,
                       int32_t rank, std::string_view nonce) {
  if (!secret) return std::string(32, '\0');
  std::string msg = "afd-group-v1" + group;
  msg += '\0';
  msg.append(reinterpret_cast<const char*>(&rank), sizeof(rank));
  msg.append(nonce);
  return std::string(AsBytes(HmacSha256(*secret, msg)));
}

void ValidateHello(const HelloHeader& h, uint32_t group_hash, int min_rank, int size) {
  AFD_CHECK(
      h.magic == kHelloMagic && h.version == kWireVersion && h.reserved == 0,
      "bad handshake (magic {:#x}, version {}, reserved {:#x}; expected {:#x}, version {}, 0)",
      h.magic, h.version, h.reserved, kHelloMagic, kWireVersion);
  AFD_CHECK(h.group_hash == group_hash, "a member of another group (hash {:#x}, expected {:#x})",
            h.group_hash, group_hash);
  AFD_CHECK(h.rank >= min_rank && h.rank < size, "rank {} is outside {}..{}", h.rank, min_rank,
            size - 1);
}

}  // namespace afd::comm

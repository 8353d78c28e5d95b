// Every byte of a transport header that can be corrupted is caught, naming the peer.
#include "afd/comm/wire.h"

#include <gtest/gtest.h>

#include <cstring>

#include "afd/common/dtype.h"
#include "afd/common/error.h"

namespace afd::comm {
namespace {

TEST(Wire, EveryCorruptedMessageHeaderByteIsCaught) {
  const MessageHeader good{
      kMessageMagic, kWireVersion, static_cast<uint8_t>(DType::kF32), 0, 7, 0, 64, 3};
  const ExpectedMessage expected{3, 7, static_cast<uint8_t>(DType::kF32), 64};
  EXPECT_NO_THROW(ValidateMessageHeader(good, expected, "rank 1 (ffn 0)"));
  for (size_t byte = 0; byte < sizeof(MessageHeader); ++byte) {
    for (uint8_t flip : {0x01, 0x80}) {
      MessageHeader bad = good;
      reinterpret_cast<uint8_t*>(&bad)[byte] ^= flip;
      try {
        ValidateMessageHeader(bad, expected, "rank 1 (ffn 0)");
        ADD_FAILURE() << "byte " << byte << " flip " << int(flip) << " went unnoticed";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1 (ffn 0)"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Wire, HelloFromOutsidersIsRefused) {
  const uint32_t hash = HashName("afd_subgroup_0");
  const HelloHeader good{kHelloMagic, kWireVersion, 0, hash, 2};
  EXPECT_NO_THROW(ValidateHello(good, hash, 1, 4));
  HelloHeader bad = good;
  bad.magic = 0x20544547;  // "GET "
  EXPECT_THROW(ValidateHello(bad, hash, 1, 4), Error);
  bad = good;
  bad.group_hash ^= 1;
  EXPECT_THROW(ValidateHello(bad, hash, 1, 4), Error);
  bad = good;
  bad.rank = 4;
  EXPECT_THROW(ValidateHello(bad, hash, 1, 4), Error);
  bad.rank = 0;
  EXPECT_THROW(ValidateHello(bad, hash, 1, 4), Error);
  bad = good;
  bad.reserved = 1;
  EXPECT_THROW(ValidateHello(bad, hash, 1, 4), Error);
}

}  // namespace
}  // namespace afd::comm

// Control-plane headers and token counts from an attention rank are checked before use.
#include <gtest/gtest.h>

#include "afd/common/error.h"
#include "afd/connector/control_plane.h"

namespace afd::connector {
namespace {

std::string ErrorOf(const ControlHeader& h) {
  try {
    ValidateControlHeader(h, 3, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ControlHeader, EachFieldIsChecked) {
  const ControlHeader good{kControlMagic, kControlVersion, 2, kShutdown, 3, 17};
  EXPECT_EQ(ErrorOf(good), "");
  ControlHeader h = good;
  h.magic = 0;
  EXPECT_NE(ErrorOf(h).find("attention rank 1 sent a header with magic 0x0"), std::string::npos);
  h = good;
  h.version = 2;
  EXPECT_NE(ErrorOf(h).find("version 2"), std::string::npos);
  h = good;
  h.num_stages = 0;
  EXPECT_NE(ErrorOf(h).find("sent 0 stages"), std::string::npos);
  h.num_stages = kMaxStages + 1;
  EXPECT_NE(ErrorOf(h).find("sent 65 stages"), std::string::npos);
  h = good;
  h.num_attention_ranks = 4;
  EXPECT_NE(ErrorOf(h).find("for 4 attention ranks"), std::string::npos);
  h = good;
  h.flags = 1u << 20;
  EXPECT_NE(ErrorOf(h).find("unknown step flags 0x100000"), std::string::npos);
}

TEST(ControlHeader, TokenCountsAreBounded) {
  EXPECT_NO_THROW(ValidateTokenCounts({0, 5, kMaxTokensPerStage}, 2));
  for (int64_t bad : {int64_t{-1}, kMaxTokensPerStage + 1, INT64_MAX}) {
    try {
      ValidateTokenCounts({0, bad}, 2);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attention rank 2 sent token count"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("(entry 1)"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace afd::connector

#include "afd/comm/nccl_plan.h"

#include <gtest/gtest.h>

#include "afd/comm/communicator.h"
#include "afd/common/error.h"

namespace afd::comm {
namespace {

TEST(NcclPlan, DirectionOfTheConnectorTags) {
  // P2pConnector tags: bit 31 = attention -> FFN.
  EXPECT_EQ(NcclCommIndexForTag(1u << 31 | (3u << 8) | 1u), 0);
  EXPECT_EQ(NcclCommIndexForTag((3u << 8) | 1u), 1);
  EXPECT_EQ(NcclCommIndexForTag(0), 1);
  // Collectives always use the first communicator.
  EXPECT_EQ(NcclCommIndexForTag(kReservedTagBase), 0);
  EXPECT_EQ(NcclCommIndexForTag(kReservedTagBase + 3), 0);
}

TEST(NcclPlan, UniqueIdKeysAndSize) {
  EXPECT_NE(NcclUniqueIdKey(0), NcclUniqueIdKey(1));
  EXPECT_THROW(NcclUniqueIdKey(2), Error);
  EXPECT_NO_THROW(CheckNcclUniqueId(std::string(128, 'x'), "g"));
  try {
    CheckNcclUniqueId(std::string(100, 'x'), "afd_subgroup_1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("afd_subgroup_1"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("100 bytes"), std::string::npos);
  }
}

TEST(NcclPlan, TwoRanksOnOneGpuAreNamed) {
  EXPECT_EQ(FindSharedGpu({"h/0000:19:00.0", "h/0000:3b:00.0"}, {"a", "b"}, "g"), std::nullopt);
  // The same bus id on different hosts is different hardware.
  EXPECT_EQ(FindSharedGpu({"h1/0000:19:00.0", "h2/0000:19:00.0"}, {"a", "b"}, "g"), std::nullopt);
  const auto msg =
      FindSharedGpu({"h/0000:19:00.0", "h/0000:3b:00.0", "h/0000:19:00.0"},
                    {"world rank 0 (ffn 0)", "x", "world rank 2 (attention 0)"}, "afd_subgroup_0");
  ASSERT_TRUE(msg.has_value());
  EXPECT_NE(msg->find("world rank 0 (ffn 0) and world rank 2 (attention 0)"), std::string::npos);
  EXPECT_NE(msg->find("h/0000:19:00.0"), std::string::npos);
}

}  // namespace
}  // namespace afd::comm

namespace afd::comm {
namespace {

TEST(NcclVersion, TextOfTheVersionCode) {
  EXPECT_EQ(NcclVersionText(22809), "2.28.9");
  EXPECT_EQ(NcclVersionText(22803), "2.28.3");
  EXPECT_EQ(NcclVersionText(21900), "2.19.0");
  EXPECT_EQ(NcclVersionText(2804), "2.8.4");  // the old encoding, before 2.9
}

// A library of the same major version at least kMinNcclVersion serves the binary (older or newer
// patch and minor alike: the host calls are stable); another major or an older one is refused
// with both versions named.
TEST(NcclVersion, LoadedLibraryMustServeTheBuild) {
  EXPECT_FALSE(NcclLibraryMismatch(22809, 22809));
  EXPECT_FALSE(NcclLibraryMismatch(22809, 22803));
  EXPECT_FALSE(NcclLibraryMismatch(22809, 23000));
  const auto old = NcclLibraryMismatch(22809, 21805);
  ASSERT_TRUE(old);
  EXPECT_NE(old->find("2.18.5"), std::string::npos) << *old;
  EXPECT_NE(old->find("2.28.9"), std::string::npos) << *old;
  EXPECT_NE(old->find("LD_LIBRARY_PATH"), std::string::npos) << *old;
  const auto major = NcclLibraryMismatch(22809, 30000);
  ASSERT_TRUE(major);
  EXPECT_NE(major->find("3.0.0"), std::string::npos) << *major;
}

TEST(NcclPlan, DeviceApiNeedsTheExactVersion) {
  EXPECT_FALSE(NcclDeviceApiMismatch(22809, 22809));
  for (int loaded : {22803, 22900, 22810}) {
    const auto e = NcclDeviceApiMismatch(22809, loaded);
    ASSERT_TRUE(e) << loaded;
    EXPECT_NE(e->find("2.28.9"), std::string::npos) << *e;
    EXPECT_NE(e->find(NcclVersionText(loaded)), std::string::npos) << *e;
    EXPECT_NE(e->find("LD_LIBRARY_PATH"), std::string::npos) << *e;
    EXPECT_NE(e->find("cuda_ipc"), std::string::npos) << *e;
  }
}

}  // namespace
}  // namespace afd::comm

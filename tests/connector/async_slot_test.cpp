// The asynchronous connector's pure parts: slot layout, header checks, routed capacity and the
// token-level dispatch plan (connector/async_slot.h, connector/dispatch_plan.h).
#include "afd/connector/async_slot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "afd/common/error.h"
#include "afd/connector/dispatch_plan.h"
#include "afd/topology/topology.h"

namespace afd::connector {
namespace {

void ExpectError(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nlacks " << p;
    }
  }
}

TEST(AsyncSlot, FieldsAreAlignedDisjointAndInBounds) {
  for (int64_t experts : {0, 1, 3, 64, 100}) {
    SlotCapacity cap{37, 53, 19, experts, 2048 * 2, 60, 37 * 16};
    const SlotLayout l = SlotLayout::Make(cap, 3, 2);
    const std::vector<std::pair<size_t, size_t>> fields = {
        {l.header, sizeof(SlotHeader) + 4 * experts},
        {l.route, 4 * 60},
        {l.routed, 53 * 4096},
        {l.row_scales, 4 * 37 * 16},
        {l.shared_index, 4 * 19},
        {l.shared, 19 * 4096}};
    size_t end = 0;
    for (const auto& [offset, bytes] : fields) {
      EXPECT_EQ(offset % kSlotAlign, 0u);
      EXPECT_GE(offset, end);  // in order, not overlapping the previous field
      end = offset + bytes;
    }
    EXPECT_LE(end, l.slot_bytes);
    EXPECT_EQ(l.slot_bytes % kSlotAlign, 0u);
    EXPECT_EQ(l.flags_bytes, 256u);  // 6 flags, padded
    EXPECT_EQ(l.window_bytes, l.flags_bytes + 6 * l.slot_bytes);
    EXPECT_EQ(l.flag_offset(2, 1), 8u * 5);
    EXPECT_EQ(l.slot_offset(0, 0), l.flags_bytes);
    EXPECT_EQ(l.slot_offset(2, 1) + l.slot_bytes, l.window_bytes);
  }
}

TEST(AsyncSlot, TheIndexTableHoldsAtLeastTheRoutedRows) {
  ExpectError([] { SlotLayout::Make({8, 10, 4, 4, 64, 9}, 2, 2); }, {"slot layout"});
}

SlotHeader GoodHeader() {
  SlotHeader h{};
  h.magic = kSlotMagic;
  h.version = kSlotVersion;
  h.sender = 1;
  h.layer = 3;
  h.stage = 1;
  h.num_tokens = 5;
  h.routed_rows = 7;
  h.shared_rows = 2;
  h.num_experts = 4;
  h.seq = 9;
  return h;
}

TEST(AsyncSlot, HeaderChecksNameTheField) {
  const SlotLayout l = SlotLayout::Make({8, 10, 4, 4, 64, 20, 8}, 2, 2);
  EXPECT_NO_THROW(ValidateSlotHeader(GoodHeader(), l, 1, 9, "slot"));
  SlotHeader fp8 = GoodHeader();
  fp8.flags = kSlotFp8Rows | kSlotGraph;
  EXPECT_NO_THROW(ValidateSlotHeader(fp8, l, 1, 9, "slot"));
  struct Corruption {
    std::function<void(SlotHeader&)> apply;
    std::string named;
  };
  const std::vector<Corruption> cases = {
      {[](SlotHeader& h) { h.magic ^= 1; }, "bad magic"},
      {[](SlotHeader& h) { h.version = 4; }, "version 4"},
      {[](SlotHeader& h) { h.flags = 1u << 7; }, "unknown flag bits"},
      {[](SlotHeader& h) { h.flags = kSlotFp8Rows | kSlotBf16Rows; }, "FP8 rows together"},
      {[](SlotHeader& h) { h.flags = kSlotFp8Rows | kSlotCombine; }, "FP8 rows together"},
      {[](SlotHeader& h) {
         h.flags = kSlotFp8Rows;
         h.routed_rows = 9;
       },
       "9 FP8 rows exceed the row scales' capacity of 8 rows"},
      {[](SlotHeader& h) { h.table_entries = 21; }, "index table entries exceed the capacity 20"},
      {[](SlotHeader& h) { h.sender = 0; }, "sender 0"},
      {[](SlotHeader& h) { h.seq = 8; }, "does not match its flag 9"},
      {[](SlotHeader& h) { h.stage = 2; }, "stage 2"},
      {[](SlotHeader& h) { h.num_tokens = 9; }, "token capacity 8"},
      {[](SlotHeader& h) { h.routed_rows = 11; }, "routed capacity 10"},
      {[](SlotHeader& h) { h.shared_rows = -1; }, "shared"},
      {[](SlotHeader& h) { h.num_experts = 5; }, "expert counts"},
      {[](SlotHeader& h) { h.layer = -1; }, "layer -1"},
  };
  for (const Corruption& c : cases) {
    SlotHeader h = GoodHeader();
    c.apply(h);
    ExpectError([&] { ValidateSlotHeader(h, l, 1, 9, "slot of rank 1"); },
                {"slot of rank 1", c.named});
  }
  // Every single-byte corruption of the header is caught, but for the layer and the echo seq,
  // which the receiver checks against what it expects (the model's MoE layers, its dispatch).
  for (size_t byte = 0; byte < sizeof(SlotHeader); ++byte) {
    SlotHeader h = GoodHeader();
    reinterpret_cast<unsigned char*>(&h)[byte] ^= 0x80;
    const bool layer = byte >= offsetof(SlotHeader, layer) && byte < offsetof(SlotHeader, stage);
    if (layer || byte >= offsetof(SlotHeader, echo_seq)) continue;
    EXPECT_THROW(ValidateSlotHeader(h, l, 1, 9, "slot"), Error) << "byte " << byte;
  }
}

TEST(DispatchPlan, EveryPairOnceGroupedByRankAndExpertTokensAscending) {
  std::mt19937 rng(7);
  for (const auto& [n, k, E, F] : std::vector<std::array<int, 4>>{
           {1, 1, 1, 1}, {9, 2, 8, 2}, {31, 6, 64, 5}, {17, 3, 7, 3}, {5, 2, 3, 4}, {0, 2, 4, 2}}) {
    std::vector<int32_t> ids(n * k);
    for (int t = 0; t < n; ++t) {
      std::set<int32_t> chosen;
      while (static_cast<int>(chosen.size()) < k) chosen.insert(rng() % E);
      std::copy(chosen.begin(), chosen.end(), ids.begin() + t * k);  // ascending per token
    }
    const DispatchPlan p = PlanDispatch(ids.data(), n, k, E, F, true);
    ASSERT_EQ(p.pair_at.size(), static_cast<size_t>(n * k));
    std::vector<int> seen(n * k, 0);
    for (int f = 0; f < F; ++f) {
      const int64_t begin = SplitOffset(E, F, f);
      ASSERT_EQ(static_cast<int64_t>(p.expert_counts[f].size()), SplitSize(E, F, f));
      int64_t at = p.segment[f];
      for (size_t e = 0; e < p.expert_counts[f].size(); ++e) {
        int32_t last_token = -1;
        for (int32_t j = 0; j < p.expert_counts[f][e]; ++j, ++at) {
          const int32_t pair = p.pair_at[at];
          EXPECT_EQ(ids[pair], begin + static_cast<int64_t>(e));  // owned by f, grouped by expert
          EXPECT_EQ(p.token_at[at], pair / k);
          EXPECT_GT(p.token_at[at], last_token);  // tokens ascending within an expert
          last_token = p.token_at[at];
          EXPECT_EQ(p.position[pair], at);
          ++seen[pair];
        }
      }
      EXPECT_EQ(at, p.segment[f + 1]);
      for (int32_t t : p.shared_tokens[f]) EXPECT_EQ(t % F, f);
      EXPECT_EQ(p.HasWork(f), p.segment[f + 1] > p.segment[f] || !p.shared_tokens[f].empty());
    }
    for (int s = 0; s < n * k; ++s) EXPECT_EQ(seen[s], 1) << "pair " << s;
  }
}

// With identity experts, the FFN returns each pair's row unchanged; combining by position with
// the weights gives the weighted sum of a token's row over its slots.
TEST(DispatchPlan, IdentityExpertsRecombineToTheWeightedSum) {
  const int n = 6, k = 2, E = 5, F = 2;
  const std::vector<int32_t> ids = {0, 4, 1, 2, 3, 4, 0, 1, 2, 3, 1, 4};
  const DispatchPlan p = PlanDispatch(ids.data(), n, k, E, F, false);
  std::vector<float> x(n), w(n * k), y(n * k);
  for (int t = 0; t < n; ++t) x[t] = 1.0f + t;
  for (int s = 0; s < n * k; ++s) w[s] = 0.25f * (s % 3 + 1);
  for (int i = 0; i < n * k; ++i) y[i] = x[p.token_at[i]];  // identity experts, sorted order
  for (int t = 0; t < n; ++t) {
    float out = 0;
    for (int j = 0; j < k; ++j) out += w[t * k + j] * y[p.position[t * k + j]];
    EXPECT_FLOAT_EQ(out, x[t] * (w[t * k] + w[t * k + 1]));
  }
  for (int f = 0; f < F; ++f) EXPECT_TRUE(p.shared_tokens[f].empty());
}

TEST(DispatchPlan, AnEmptyDestinationGetsNothingAndBadIdsAreNamed) {
  const std::vector<int32_t> ids = {0, 1, 0, 1};  // all on FFN rank 0 of 3
  const DispatchPlan p = PlanDispatch(ids.data(), 2, 2, 6, 3, false);
  EXPECT_TRUE(p.HasWork(0));
  EXPECT_FALSE(p.HasWork(1));
  EXPECT_FALSE(p.HasWork(2));
  const std::vector<int32_t> bad = {0, 6};
  ExpectError([&] { PlanDispatch(bad.data(), 1, 2, 6, 3, false); },
              {"token 0 slot 1", "expert 6", "[0, 6)"});
}

}  // namespace
}  // namespace afd::connector

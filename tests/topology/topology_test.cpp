#include "afd/topology/topology.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "afd/common/error.h"

namespace afd {
namespace {

constexpr Role kA = Role::kAttention;
constexpr Role kF = Role::kFfn;

// Subgroup members as role labels, e.g. {"F0", "A0", "A1"}.
std::vector<std::string> Labels(const Topology& t, const std::vector<int>& world_ranks) {
  std::vector<std::string> out;
  for (int w : world_ranks) {
    const RoleRank r = t.RoleOfWorldRank(w);
    out.push_back(std::string(r.role == kF ? "F" : "A").append(std::to_string(r.rank)));
  }
  return out;
}

using Groups = std::vector<std::vector<std::string>>;

Groups AllSubgroups(const Topology& t) {
  Groups g;
  for (int i = 0; i < t.num_subgroups(); ++i) g.push_back(Labels(t, t.SubgroupMembers(i)));
  return g;
}

// ---- Literal snapshots of the seed tables ----

TEST(TopologySnapshot, Seed000Table) {
  EXPECT_EQ(AllSubgroups(Topology(1, 1)), (Groups{{"F0", "A0"}}));
  EXPECT_EQ(AllSubgroups(Topology(2, 2)), (Groups{{"F0", "A0"}, {"F1", "A1"}}));
  EXPECT_EQ(AllSubgroups(Topology(4, 2)), (Groups{{"F0", "A0", "A1"}, {"F1", "A2", "A3"}}));
  EXPECT_EQ(AllSubgroups(Topology(3, 2)), (Groups{{"F0", "A0", "A1"}, {"F1", "A2"}}));
  EXPECT_EQ(AllSubgroups(Topology(4, 4)),
            (Groups{{"F0", "A0"}, {"F1", "A1"}, {"F2", "A2"}, {"F3", "A3"}}));
}

TEST(TopologySnapshot, Seed000WorkedExample4A2F) {
  const Topology t(4, 2);
  EXPECT_EQ(t.world_size(), 6);
  EXPECT_EQ(Labels(t, {0, 1, 2, 3, 4, 5}),
            (std::vector<std::string>{"F0", "F1", "A0", "A1", "A2", "A3"}));
  // Data plane: FFN at subgroup rank 0, attention peers at 1..ratio.
  EXPECT_EQ(t.SubgroupMembers(0), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(t.SubgroupMembers(1), (std::vector<int>{1, 4, 5}));
  EXPECT_EQ(t.SubgroupRank({kF, 1}), 0);
  EXPECT_EQ(t.SubgroupRank({kA, 2}), 1);
  EXPECT_EQ(t.SubgroupRank({kA, 3}), 2);
  EXPECT_EQ(t.HubRole(), kF);
  // Control plane: size 4, F0=0 F1=1 A0=2 A1=3, A2 and A3 excluded; A0 -> F0, A1 -> F1.
  EXPECT_EQ(t.control_plane_size(), 4);
  EXPECT_EQ(t.ControlPlaneMembers(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.ControlPlaneRank({kA, 0}), 2);
  EXPECT_EQ(t.ControlPlaneRank({kA, 1}), 3);
  EXPECT_EQ(t.ControlPlaneRank({kA, 2}), std::nullopt);
  EXPECT_EQ(t.ControlPlaneRank({kA, 3}), std::nullopt);
  EXPECT_EQ(t.ControlRouteTargets(0), (std::vector<int>{0}));
  EXPECT_EQ(t.ControlRouteTargets(1), (std::vector<int>{1}));
  EXPECT_TRUE(t.ControlRouteTargets(2).empty());
}

TEST(TopologySnapshot, Seed001AttentionFewerThanFfn) {
  // 1A2F: one subgroup, FFN members first, the attention rank is the hub.
  const Topology t12(1, 2);
  EXPECT_EQ(AllSubgroups(t12), (Groups{{"F0", "F1", "A0"}}));
  EXPECT_EQ(t12.HubRole(), kA);
  EXPECT_EQ(t12.SubgroupRank({kA, 0}), 2);
  EXPECT_EQ(t12.ControlPlaneMembers(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(t12.ControlRouteTargets(0), (std::vector<int>{0, 1}));
  // 1A4F.
  const Topology t14(1, 4);
  EXPECT_EQ(AllSubgroups(t14), (Groups{{"F0", "F1", "F2", "F3", "A0"}}));
  EXPECT_EQ(t14.ControlRouteTargets(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t14.world_size(), 5);
  EXPECT_EQ(t14.WorldRank({kA, 0}), 4);
}

TEST(TopologySnapshot, NonDivisibleBothWays) {
  EXPECT_EQ(AllSubgroups(Topology(2, 5)), (Groups{{"F0", "F1", "F2", "A0"}, {"F3", "F4", "A1"}}));
  EXPECT_EQ(AllSubgroups(Topology(5, 3)),
            (Groups{{"F0", "A0", "A1"}, {"F1", "A2", "A3"}, {"F2", "A4"}}));
  const Topology t(2, 5);
  EXPECT_EQ(t.ControlRouteTargets(0), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(t.ControlRouteTargets(1), (std::vector<int>{1, 3}));
}

// ---- Properties over every A, F in 1..16 ----

TEST(TopologyProperties, EveryAFUpTo16) {
  for (int A = 1; A <= 16; ++A) {
    for (int F = 1; F <= 16; ++F) {
      SCOPED_TRACE(testing::Message() << A << "A" << F << "F");
      const Topology t(A, F);
      const int G = std::min(A, F);
      ASSERT_EQ(t.num_subgroups(), G);
      ASSERT_EQ(t.world_size(), A + F);
      // World: FFN first.
      for (int f = 0; f < F; ++f) ASSERT_EQ(t.WorldRank({kF, f}), f);
      for (int a = 0; a < A; ++a) ASSERT_EQ(t.WorldRank({kA, a}), F + a);
      for (int w = 0; w < A + F; ++w) ASSERT_EQ(t.WorldRank(t.RoleOfWorldRank(w)), w);

      std::vector<int> seen(A + F, 0);
      int min_attn = A, max_attn = 0, min_ffn = F, max_ffn = 0;
      for (int g = 0; g < G; ++g) {
        const RankRange fr = t.FfnRanksOf(g), ar = t.AttentionRanksOf(g);
        ASSERT_GE(fr.size(), 1);  // no empty subgroup, on either side
        ASSERT_GE(ar.size(), 1);
        // The smaller role has exactly one member per subgroup: a hub with spokes.
        ASSERT_TRUE(fr.size() == 1 || ar.size() == 1);
        min_attn = std::min(min_attn, ar.size());
        max_attn = std::max(max_attn, ar.size());
        min_ffn = std::min(min_ffn, fr.size());
        max_ffn = std::max(max_ffn, fr.size());
        const std::vector<int> members = t.SubgroupMembers(g);
        ASSERT_EQ(static_cast<int>(members.size()), fr.size() + ar.size());
        for (size_t i = 0; i < members.size(); ++i) {
          const RoleRank r = t.RoleOfWorldRank(members[i]);
          ++seen[members[i]];
          ASSERT_EQ(t.SubgroupOf(r), g);
          ASSERT_EQ(t.SubgroupRank(r), static_cast<int>(i));
          // FFN first, then attention, contiguous and in role-rank order.
          if (static_cast<int>(i) < fr.size()) {
            ASSERT_EQ(r, (RoleRank{kF, fr.begin + static_cast<int>(i)}));
          } else {
            ASSERT_EQ(r, (RoleRank{kA, ar.begin + static_cast<int>(i) - fr.size()}));
          }
        }
        // Subgroup formula: a*G/A and f*G/F.
        for (int a = ar.begin; a < ar.end; ++a) ASSERT_EQ(a * G / A, g);
        for (int f = fr.begin; f < fr.end; ++f) ASSERT_EQ(f * G / F, g);
      }
      for (int w = 0; w < A + F; ++w) ASSERT_EQ(seen[w], 1) << "world rank " << w;
      ASSERT_LE(max_attn - min_attn, 1);
      ASSERT_LE(max_ffn - min_ffn, 1);
      if (A >= F) {
        ASSERT_EQ(t.HubRole(), kF);
      }

      // Control plane: each FFN rank on exactly one route, from attention rank f % G.
      std::vector<int> routed(F, 0);
      for (int a = 0; a < A; ++a) {
        const std::vector<int> targets = t.ControlRouteTargets(a);
        if (a >= G) {
          ASSERT_TRUE(targets.empty());
        }
        for (int f : targets) {
          ++routed[f];
          ASSERT_EQ(t.ControlRouteSource(f), a);
        }
      }
      for (int f = 0; f < F; ++f) ASSERT_EQ(routed[f], 1) << "FFN rank " << f;
      const std::vector<int> cp = t.ControlPlaneMembers();
      ASSERT_EQ(static_cast<int>(cp.size()), F + G);
      for (int p = 0; p < F + G; ++p) {
        ASSERT_EQ(t.ControlPlaneRank(t.RoleOfWorldRank(cp[p])), p);
      }
    }
  }
}

TEST(TopologyErrors, RejectsBadCountsAndRanks) {
  EXPECT_THROW(Topology(0, 1), Error);
  EXPECT_THROW(Topology(1, 0), Error);
  EXPECT_THROW(Topology(-3, 2), Error);
  EXPECT_THROW(Topology(kMaxRanksPerRole + 1, 1), Error);
  const Topology t(3, 2);
  EXPECT_THROW(t.WorldRank({kA, 3}), Error);
  EXPECT_THROW(t.WorldRank({kF, -1}), Error);
  EXPECT_THROW(t.RoleOfWorldRank(5), Error);
  EXPECT_THROW(t.SubgroupMembers(2), Error);
  EXPECT_THROW(t.ControlRouteTargets(3), Error);
  try {
    t.WorldRank({kA, 7});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "attention role rank 7 is out of range 0..2");
  }
}

TEST(TopologyLarge, HugeCountsDoNotOverflow) {
  const Topology t(kMaxRanksPerRole, kMaxRanksPerRole - 1);
  EXPECT_EQ(t.SubgroupOf({kA, kMaxRanksPerRole - 1}), kMaxRanksPerRole - 2);
  EXPECT_EQ(t.AttentionRanksOf(t.num_subgroups() - 1).end, kMaxRanksPerRole);
}

// ---- Split sizes ----

TEST(SplitSizes, Values) {
  EXPECT_EQ(SplitSizes(5, 3), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(SplitSizes(6, 3), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(SplitSizes(1, 4), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(SplitSizes(0, 2), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(SplitSizes(7, 1), (std::vector<int64_t>{7}));
}

TEST(SplitSizes, Properties) {
  for (int64_t n = 0; n <= 200; ++n) {
    for (int m = 1; m <= 17; ++m) {
      const std::vector<int64_t> s = SplitSizes(n, m);
      ASSERT_EQ(static_cast<int>(s.size()), m);
      ASSERT_EQ(std::accumulate(s.begin(), s.end(), int64_t{0}), n);
      int64_t offset = 0;
      for (int i = 0; i < m; ++i) {
        ASSERT_GE(s[i], 0);
        ASSERT_LE(s.front() - s[i], 1);  // differ by at most one
        if (i > 0) {
          ASSERT_LE(s[i], s[i - 1]);  // earlier peers larger
        }
        ASSERT_EQ(SplitSize(n, m, i), s[i]);
        ASSERT_EQ(SplitOffset(n, m, i), offset);
        offset += s[i];
      }
      ASSERT_EQ(SplitOffset(n, m, m), n);
    }
  }
}

TEST(SplitSizes, RejectsBadInput) {
  EXPECT_THROW(SplitSizes(-1, 2), Error);
  EXPECT_THROW(SplitSizes(3, 0), Error);
  EXPECT_THROW(SplitSize(3, 2, 2), Error);
  EXPECT_THROW(SplitOffset(3, 2, 3), Error);
}

}  // namespace
}  // namespace afd

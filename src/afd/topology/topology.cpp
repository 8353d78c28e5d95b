#include "afd/topology/topology.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd {

std::string_view RoleName(Role role) { return role == Role::kAttention ? "attention" : "ffn"; }

namespace {

// ceil(num / den) for num >= 0, den > 0.
int64_t CeilDiv(int64_t num, int64_t den) { return (num + den - 1) / den; }

}  // namespace

Topology::Topology(int num_attention, int num_ffn)
    : num_attention_(num_attention), num_ffn_(num_ffn) {
  AFD_CHECK(num_attention >= 1 && num_attention <= kMaxRanksPerRole,
            "num_attention_ranks must be in 1..{}, got {}", kMaxRanksPerRole, num_attention);
  AFD_CHECK(num_ffn >= 1 && num_ffn <= kMaxRanksPerRole, "num_ffn_ranks must be in 1..{}, got {}",
            kMaxRanksPerRole, num_ffn);
  num_subgroups_ = std::min(num_attention, num_ffn);
}

int Topology::CheckRoleRank(RoleRank r) const {
  const int size = r.role == Role::kAttention ? num_attention_ : num_ffn_;
  AFD_CHECK(r.rank >= 0 && r.rank < size, "{} role rank {} is out of range 0..{}", RoleName(r.role),
            r.rank, size - 1);
  return size;
}

void Topology::CheckSubgroup(int subgroup) const {
  AFD_CHECK(subgroup >= 0 && subgroup < num_subgroups_, "subgroup {} is out of range 0..{}",
            subgroup, num_subgroups_ - 1);
}

int Topology::WorldRank(RoleRank r) const {
  CheckRoleRank(r);
  return r.role == Role::kFfn ? r.rank : num_ffn_ + r.rank;
}

RoleRank Topology::RoleOfWorldRank(int world_rank) const {
  AFD_CHECK(world_rank >= 0 && world_rank < world_size(), "world rank {} is out of range 0..{}",
            world_rank, world_size() - 1);
  if (world_rank < num_ffn_) return {Role::kFfn, world_rank};
  return {Role::kAttention, world_rank - num_ffn_};
}

int Topology::SubgroupOf(RoleRank r) const {
  const int size = CheckRoleRank(r);
  return static_cast<int>(static_cast<int64_t>(r.rank) * num_subgroups_ / size);
}

// Members of role size n in subgroup g are the r with r*G/n == g, i.e. g*n <= r*G < (g+1)*n,
// i.e. r in [ceil(g*n/G), ceil((g+1)*n/G)).
RankRange Topology::FfnRanksOf(int subgroup) const {
  CheckSubgroup(subgroup);
  const int64_t n = num_ffn_, g = subgroup, G = num_subgroups_;
  return {static_cast<int>(CeilDiv(g * n, G)), static_cast<int>(CeilDiv((g + 1) * n, G))};
}

RankRange Topology::AttentionRanksOf(int subgroup) const {
  CheckSubgroup(subgroup);
  const int64_t n = num_attention_, g = subgroup, G = num_subgroups_;
  return {static_cast<int>(CeilDiv(g * n, G)), static_cast<int>(CeilDiv((g + 1) * n, G))};
}

std::vector<int> Topology::SubgroupMembers(int subgroup) const {
  const RankRange ffn = FfnRanksOf(subgroup);
  const RankRange attn = AttentionRanksOf(subgroup);
  std::vector<int> members;
  members.reserve(ffn.size() + attn.size());
  for (int f = ffn.begin; f < ffn.end; ++f) members.push_back(WorldRank({Role::kFfn, f}));
  for (int a = attn.begin; a < attn.end; ++a) members.push_back(WorldRank({Role::kAttention, a}));
  return members;
}

int Topology::SubgroupRank(RoleRank r) const {
  const int g = SubgroupOf(r);
  const RankRange ffn = FfnRanksOf(g);
  if (r.role == Role::kFfn) return r.rank - ffn.begin;
  return ffn.size() + (r.rank - AttentionRanksOf(g).begin);
}

std::vector<int> Topology::ControlPlaneMembers() const {
  std::vector<int> members;
  members.reserve(control_plane_size());
  for (int f = 0; f < num_ffn_; ++f) members.push_back(WorldRank({Role::kFfn, f}));
  for (int a = 0; a < num_subgroups_; ++a) members.push_back(WorldRank({Role::kAttention, a}));
  return members;
}

std::optional<int> Topology::ControlPlaneRank(RoleRank r) const {
  CheckRoleRank(r);
  if (r.role == Role::kFfn) return r.rank;
  if (r.rank < num_subgroups_) return num_ffn_ + r.rank;
  return std::nullopt;
}

std::vector<int> Topology::ControlRouteTargets(int attention_rank) const {
  CheckRoleRank({Role::kAttention, attention_rank});
  std::vector<int> targets;
  if (attention_rank >= num_subgroups_) return targets;
  for (int f = attention_rank; f < num_ffn_; f += num_subgroups_) targets.push_back(f);
  return targets;
}

int Topology::ControlRouteSource(int ffn_rank) const {
  CheckRoleRank({Role::kFfn, ffn_rank});
  return ffn_rank % num_subgroups_;
}

std::vector<int64_t> SplitSizes(int64_t n, int m) {
  AFD_CHECK(n >= 0, "split: row count must be >= 0, got {}", n);
  AFD_CHECK(m >= 1, "split: peer count must be >= 1, got {}", m);
  std::vector<int64_t> sizes(m);
  for (int i = 0; i < m; ++i) sizes[i] = (n + m - 1 - i) / m;
  return sizes;
}

int64_t SplitSize(int64_t n, int m, int i) {
  AFD_CHECK(n >= 0, "split: row count must be >= 0, got {}", n);
  AFD_CHECK(m >= 1, "split: peer count must be >= 1, got {}", m);
  AFD_CHECK(i >= 0 && i < m, "split: peer index {} is out of range 0..{}", i, m - 1);
  return (n + m - 1 - i) / m;
}

int64_t SplitOffset(int64_t n, int m, int i) {
  AFD_CHECK(i >= 0 && i <= m, "split: peer index {} is out of range 0..{}", i, m);
  // The first (n % m) peers get q+1 rows, the rest q.
  SplitSize(n, m, 0);  // validates n and m
  const int64_t q = n / m, rem = n % m;
  return static_cast<int64_t>(i) * q + std::min<int64_t>(i, rem);
}

}  // namespace afd

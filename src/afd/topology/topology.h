// AFD rank math: pure functions of (num_attention_ranks A, num_ffn_ranks F). No I/O.
//
// One process sits at up to three rank numbers, all derived from its role and role rank:
//   * AFD world rank: FFN first. FFN role rank i -> world rank i; attention role rank j -> F + j.
//   * Subgroup (data plane): G = min(A, F) subgroups. Attention rank a joins subgroup a*G/A,
//     FFN rank f joins f*G/F (integer division). Both maps are onto, so no subgroup is empty and
//     members of one role in a subgroup are contiguous. Inside a subgroup, FFN members come first,
//     then attention members, each in role-rank order. The role with fewer ranks has exactly one
//     member per subgroup: the hub. For A >= F the hub is the FFN rank (subgroup rank 0).
//   * Control plane ("p2p" group, size F + G): FFN rank f has p2p rank f; attention rank r < G
//     has p2p rank F + r; attention ranks r >= G are not members. Attention rank r < G sends the
//     DP metadata to FFN ranks r, r+G, r+2G, ... < F, so every FFN rank has exactly one sender.
//
// Thread safety: Topology is immutable after construction; all methods are const and safe to
// call from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace afd {

enum class Role { kAttention, kFfn };

// "attention" or "ffn".
std::string_view RoleName(Role role);

// Upper bound on ranks per role; keeps every product of rank numbers far inside int64.
inline constexpr int kMaxRanksPerRole = 1 << 20;

struct RoleRank {
  Role role;
  int rank;  // rank within the role, 0-based
  bool operator==(const RoleRank&) const = default;
};

// Half-open range [begin, end) of role ranks.
struct RankRange {
  int begin;
  int end;
  int size() const { return end - begin; }
  bool operator==(const RankRange&) const = default;
};

class Topology {
 public:
  // Throws afd::Error unless 1 <= num_attention, num_ffn <= kMaxRanksPerRole.
  Topology(int num_attention, int num_ffn);

  int num_attention() const { return num_attention_; }
  int num_ffn() const { return num_ffn_; }
  int world_size() const { return num_attention_ + num_ffn_; }
  int num_subgroups() const { return num_subgroups_; }

  // ---- AFD world ----
  // Throws afd::Error when role_rank is out of range for its role.
  int WorldRank(RoleRank r) const;
  // Throws afd::Error when world_rank is outside [0, world_size).
  RoleRank RoleOfWorldRank(int world_rank) const;

  // ---- Data plane ----
  int SubgroupOf(RoleRank r) const;
  RankRange FfnRanksOf(int subgroup) const;
  RankRange AttentionRanksOf(int subgroup) const;
  // World ranks of the subgroup in subgroup-rank order (FFN members first).
  std::vector<int> SubgroupMembers(int subgroup) const;
  // Rank of r inside its subgroup.
  int SubgroupRank(RoleRank r) const;
  // The role that has exactly one member per subgroup (FFN when A >= F).
  Role HubRole() const { return num_attention_ >= num_ffn_ ? Role::kFfn : Role::kAttention; }

  // ---- Control plane ----
  int control_plane_size() const { return num_ffn_ + num_subgroups_; }
  // World ranks in p2p-rank order.
  std::vector<int> ControlPlaneMembers() const;
  // p2p rank of r, or nullopt when r is not a member.
  std::optional<int> ControlPlaneRank(RoleRank r) const;
  // FFN role ranks that attention rank `attention_rank` sends DP metadata to (empty if r >= G).
  std::vector<int> ControlRouteTargets(int attention_rank) const;
  // The attention role rank that sends DP metadata to FFN rank `ffn_rank`.
  int ControlRouteSource(int ffn_rank) const;

 private:
  int CheckRoleRank(RoleRank r) const;  // returns the role's size
  void CheckSubgroup(int subgroup) const;

  int num_attention_;
  int num_ffn_;
  int num_subgroups_;
};

// Balanced split of n rows over m peers: sizes differ by at most one, earlier peers get the
// larger share, zeros allowed. Closed form sizes[i] = (n + m - 1 - i) / m, so sender and receiver
// compute the same answer without talking. Throws afd::Error if n < 0 or m < 1.
std::vector<int64_t> SplitSizes(int64_t n, int m);
// Size of peer i's share alone (same closed form). Throws on bad n, m or i.
int64_t SplitSize(int64_t n, int m, int i);
// Row offset of peer i's share: sum of sizes[0..i).
int64_t SplitOffset(int64_t n, int m, int i);

}  // namespace afd

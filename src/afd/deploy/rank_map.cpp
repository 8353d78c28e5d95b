#include "afd/deploy/rank_map.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace afd::deploy {

namespace {

// "F0", "A3": role letter and role rank.
std::string Label(const Topology& t, int world_rank) {
  const RoleRank r = t.RoleOfWorldRank(world_rank);
  return fmt::format("{}{}", r.role == Role::kFfn ? 'F' : 'A', r.rank);
}

}  // namespace

std::string TopologyText(const Topology& t) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  line(
      fmt::format("AFD topology {}A{}F: {} attention rank(s), {} FFN rank(s), world size {}, {} "
                  "subgroup(s), hub role {}",
                  t.num_attention(), t.num_ffn(), t.num_attention(), t.num_ffn(), t.world_size(),
                  t.num_subgroups(), RoleName(t.HubRole())));
  line("");
  std::string world;
  for (int w = 0; w < t.world_size(); ++w) world += fmt::format("{}={}  ", Label(t, w), w);
  line(fmt::format("AFD world (port):        {}", world.substr(0, world.size() - 2)));
  line("");
  line("Data plane:");
  for (int g = 0; g < t.num_subgroups(); ++g) {
    const std::vector<int> members = t.SubgroupMembers(g);
    const int num_ffn = t.FfnRanksOf(g).size();
    std::string ffn, attn;
    for (size_t i = 0; i < members.size(); ++i) {
      std::string& side = static_cast<int>(i) < num_ffn ? ffn : attn;
      if (!side.empty()) side += ", ";
      side += fmt::format("{}(rank {})", Label(t, members[i]), i);
    }
    line(fmt::format("  subgroup {} (prefix afd_subgroup_{}):   {} <-> {}", g, g, ffn, attn));
  }
  line("");
  line(fmt::format("Control plane \"p2p\" group (port, size {}):", t.control_plane_size()));
  std::string p2p;
  const std::vector<int> cp = t.ControlPlaneMembers();
  for (size_t i = 0; i < cp.size(); ++i) p2p += fmt::format("{}={}  ", Label(t, cp[i]), i);
  p2p = p2p.substr(0, p2p.size() - 2);
  if (t.num_attention() > t.num_subgroups()) {
    std::string excluded;
    for (int a = t.num_subgroups(); a < t.num_attention(); ++a) {
      excluded += fmt::format("{}A{}", excluded.empty() ? "" : ", ", a);
    }
    p2p += fmt::format("      ({} excluded)", excluded);
  }
  line(fmt::format("  p2p ranks:             {}", p2p));
  std::string flow;
  for (int a = 0; a < t.num_subgroups(); ++a) {
    std::string targets;
    for (int f : t.ControlRouteTargets(a))
      targets += fmt::format("{}F{}", targets.empty() ? "" : ", ", f);
    flow += fmt::format("{}A{} -> {}", flow.empty() ? "" : ",   ", a, targets);
  }
  line(fmt::format("  metadata flow:         {}", flow));
  return out;
}

std::string TopologyJson(const Topology& t, int indent) {
  using nlohmann::ordered_json;
  ordered_json out;
  out["attention"] = t.num_attention();
  out["ffn"] = t.num_ffn();
  ordered_json world = ordered_json::array();
  for (int w = 0; w < t.world_size(); ++w) {
    const RoleRank r = t.RoleOfWorldRank(w);
    world.push_back({{"rank", w}, {"role", std::string(RoleName(r.role))}, {"role_rank", r.rank}});
  }
  out["world"] = world;
  ordered_json subgroups = ordered_json::array();
  for (int g = 0; g < t.num_subgroups(); ++g) {
    subgroups.push_back({{"index", g}, {"members", t.SubgroupMembers(g)}});
  }
  out["subgroups"] = subgroups;
  ordered_json routes = ordered_json::array();
  for (int a = 0; a < t.num_subgroups(); ++a) {
    routes.push_back({{"attention", a}, {"ffn", t.ControlRouteTargets(a)}});
  }
  out["control_plane"] = {{"members", t.ControlPlaneMembers()}, {"routes", routes}};
  return out.dump(indent);
}

}  // namespace afd::deploy

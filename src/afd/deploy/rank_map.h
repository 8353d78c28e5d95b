// The rank map of a deployment, as text in the style of the P2P connector guide's 4A2F worked
// example and as JSON (docs/topology.md).
#pragma once

#include <string>

#include "afd/topology/topology.h"

namespace afd::deploy {

// Human-readable rank map in the style of the P2P connector guide's 4A2F worked example.
std::string TopologyText(const Topology& topology);
// {"attention", "ffn", "world", "subgroups", "control_plane"} as documented in docs/topology.md.
std::string TopologyJson(const Topology& topology, int indent = 2);

}  // namespace afd::deploy

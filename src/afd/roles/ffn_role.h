// The FFN role of one AFD rank, whatever its connector: it serves the attention ranks' MoE
// layers until every one of them has ended. P2pFfnWorker (the P2P connector: a step at a time,
// driven by the attention ranks' metadata) and AsyncFfnWorker (the asynchronous window
// connector: work items as they arrive) implement it; deploy/role_worker.cpp makes one and runs
// it.
// Thread safety: one thread calls every method.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "afd/topology/expert_range.h"

namespace afd::roles {

class FfnRole {
 public:
  virtual ~FfnRole() = default;
  // Serves until every attention rank has ended. Returns the work served (the P2P role: steps;
  // the asynchronous one: work items). Throws afd::Error naming the peer on a failure.
  virtual int64_t Run() = 0;
  // The routed experts this rank holds.
  virtual ExpertRange experts() const = 0;
  // Its counters (rows served, graph replays, ...) by name, for the rank's stats file; read
  // after Run.
  virtual std::vector<std::pair<std::string, int64_t>> Counters() const = 0;
};

}  // namespace afd::roles

// The serving loop of an attention rank (`afd worker --engine-endpoint`): the runtime::Engine of
// its data-parallel replica fed by the frontend over the engine channel (deploy/engine_wire.h).
// TP rank 0 of the replica holds the connection; every step it takes the frames that arrived,
// hands them to its TP peers (so every rank of the replica schedules the same steps), runs one
// engine step -- or, with nothing to do, an idle step (runtime::ReplicaRunner::Idle: with the
// P2P connector it keeps the lockstep with the other replicas; with the asynchronous one the
// replica just waits for requests) -- and reports the step's outputs, its load and
// the MoE round trips. A shutdown frame lets the replica finish its work and then leave; the
// deployment ends when every replica has left. A lost frontend connection is an error.
#pragma once

#include <string>

#include "afd/comm/afd_world.h"
#include "afd/runtime/engine.h"
#include "afd/runtime/step_runner.h"

namespace afd::deploy {

struct ReplicaServeOptions {
  std::string endpoint;  // host:port of the frontend's engine listener
  int dp_rank = 0;
  int tp = 1;
  int tp_rank = 0;
  runtime::EngineOptions engine;
  // A headless host may start long before its API server's host: as long as the frontend waits
  // for its replicas (ServeHttpOptions::ready_timeout_s).
  double connect_timeout_s = 900;
};

// Returns when the deployment shut down cleanly; throws afd::Error otherwise. `world` forms the
// replica's TP group (tp > 1); null for a replica of one rank (also outside AFD: a rank of a
// data-parallel + expert-parallel deployment).
void ServeReplica(const model::MoeModel& model, comm::AfdWorld* world,
                  runtime::ReplicaRunner& runner, const ReplicaServeOptions& options);

// "host:port" -> (host, port); throws afd::Error naming `what`.
std::pair<std::string, int> ParseEndpoint(const std::string& endpoint, const std::string& what);

}  // namespace afd::deploy

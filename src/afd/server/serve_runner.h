// Serving until stopped: the OpenAI API (server/api) in front of engines -- in this process
// (a monolithic model: `afd serve` without an AFD role) or in the attention replica processes
// of a deployment (`afd serve` of the attention role, `afd launch`). SIGINT/SIGTERM: stop
// accepting, let in-flight requests finish (up to shutdown_timeout_s, then they end with an
// error), shut the engines and processes down, return 0 with no process left. A process that
// dies: in-flight requests get an error and the call returns non-zero naming the process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "afd/deploy/launcher.h"
#include "afd/server/api/api_server.h"
#include "afd/server/replica_engine_client.h"
#include "afd/text/chat_template/chat_template.h"
#include "afd/text/tokenizer/tokenizer.h"

namespace afd::server {

struct ServeHttpOptions {
  ApiServerOptions api;
  std::string tokenizer_dir;       // "": token-id prompts only
  double ready_timeout_s = 900;    // model loading and joining, at most
  double shutdown_timeout_s = 30;  // in-flight requests after SIGTERM, at most
  double stop_grace_s = 30;        // then the processes' own exit, at most (then SIGTERM)
};

// The tokenizer and chat template of `dir` (both null for ""; the template null when the
// tokenizer has none). Throws afd::Error naming the file for a bad directory or template.
struct ServingTokenizer {
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<text::ChatTemplate> chat_template;
};
ServingTokenizer LoadServingTokenizer(const std::string& dir);

// Serves `engine` (already running in this process) until a stop signal or an engine failure.
// Returns the exit code.
int ServeEngine(const ServeHttpOptions& options, EngineClient& engine, const ServingTokenizer& tok);

// Starts `specs` (the processes of this host; those marked serves_engine get --engine-endpoint
// of a ReplicaEngineClient expecting `num_replicas` replicas from DP rank `first_dp_rank`),
// serves them until a stop signal or a failure. Returns the exit code.
// `listen`: where the engine listener binds and the join secret replicas prove (default:
// 127.0.0.1, an ephemeral port, no secret); replicas of other hosts (headless `afd serve`)
// connect there too. `specs` may be empty (an API server whose replicas are all remote).
int ServeReplicas(const ServeHttpOptions& options, std::vector<deploy::RankProcessSpec> specs,
                  int num_replicas, int first_dp_rank, const ServingTokenizer& tok,
                  EngineListenOptions listen = {});

}  // namespace afd::server

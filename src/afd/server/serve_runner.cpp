#include "afd/server/serve_runner.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "afd/comm/join_secret.h"
#include "afd/common/error.h"
#include "afd/common/stop_signals.h"
#include "afd/server/replica_engine_client.h"

namespace afd::server {

namespace {

// Lets in-flight requests finish (at most timeout_s), then stops the API server.
void StopApi(ApiServer& api, double timeout_s) {
  api.BeginShutdown();
  const Deadline deadline = Deadline::In(timeout_s);
  while (api.num_in_flight() > 0 && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (api.num_in_flight() > 0) {
    std::cerr << "afd serve: " << api.num_in_flight()
              << " request(s) still running after the shutdown timeout end with an error"
              << std::endl;
  }
  api.Stop();
}

std::string Listening(const ServeHttpOptions& o, const ApiServer& api) {
  std::string names;
  for (const auto& n : o.api.served_model_names) names += (names.empty() ? "" : ", ") + n;
  return fmt::format("afd serve: the OpenAI API is up on http://{}:{} (model {}{})", o.api.host,
                     api.port(), names, o.tokenizer_dir.empty() ? ", token-id prompts only" : "");
}

}  // namespace

ServingTokenizer LoadServingTokenizer(const std::string& dir) {
  ServingTokenizer t;
  if (dir.empty()) return t;
  t.tokenizer = text::Tokenizer::Load(dir);
  if (!t.tokenizer->chat_template().empty()) {
    try {
      t.chat_template = std::make_unique<text::ChatTemplate>(t.tokenizer->chat_template());
    } catch (const Error& e) {
      AFD_THROW("--tokenizer {}: the chat template does not parse: {}", dir, e.what());
    }
  }
  return t;
}

int ServeEngine(const ServeHttpOptions& o, EngineClient& engine, const ServingTokenizer& tok) {
  ApiServer api(o.api, engine, tok.tokenizer.get(), tok.chat_template.get());
  api.Start();
  std::cerr << Listening(o, api) << std::endl;
  while (true) {
    if (const int sig = WaitStopSignal(0.2)) {
      std::cerr << "afd serve: " << StopSignalName(sig) << ": stopping" << std::endl;
      StopApi(api, o.shutdown_timeout_s);
      return 0;
    }
    const std::string failure = engine.Failure();
    if (!failure.empty()) {
      api.Stop();
      std::cerr << "afd serve: error: " << failure << std::endl;
      return 1;
    }
  }
}

int ServeReplicas(const ServeHttpOptions& o, std::vector<deploy::RankProcessSpec> specs,
                  int num_replicas, int first_dp_rank, const ServingTokenizer& tok,
                  EngineListenOptions listen) {
  // The replicas prove the join secret of the environment, which they inherit or were given:
  // none only on a loopback listener (the store's policy, comm/join_secret.h).
  listen.secret = comm::ResolveJoinSecret(listen.host.empty() ? "0.0.0.0" : listen.host);
  ReplicaEngineClient client(num_replicas, first_dp_rank, std::move(listen));
  for (deploy::RankProcessSpec& s : specs) {
    if (s.serves_engine) s.argv.insert(s.argv.end(), {"--engine-endpoint", client.endpoint()});
  }
  // The processes run on a thread; their failure (named by the launcher) ends the serving. An
  // API server with no local replicas (--data-parallel-size-local 0) starts none.
  std::atomic<bool> kill{false}, launcher_done{false};
  std::string launcher_error;
  std::thread launcher;
  if (!specs.empty()) {
    launcher = std::thread([&] {
      try {
        deploy::RunRankProcesses(specs, 120, &kill);
      } catch (const Error& e) {
        launcher_error = e.what();
        client.SetFailure(e.what());
      }
      launcher_done = true;
    });
  }
  auto finish = [&](bool killing) {
    if (killing) kill = true;
    if (launcher.joinable()) launcher.join();
  };
  // A failure the launcher explains (a dead process) beats the engine client's view of it.
  auto failure_text = [&] {
    const Deadline wait = Deadline::In(5.0);
    while (launcher.joinable() && !launcher_done && !wait.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return launcher_done && !launcher_error.empty() ? launcher_error : client.Failure();
  };

  std::cerr << fmt::format(
                   "afd serve: starting {} process(es); waiting for {} attention "
                   "replica(s) to load the model and join",
                   specs.size(), num_replicas)
            << std::endl;
  const Deadline ready_by = Deadline::In(o.ready_timeout_s);
  while (!client.Ready()) {
    if (const int sig = WaitStopSignal(0.1)) {
      std::cerr << "afd serve: " << StopSignalName(sig) << " before the deployment was up: stopping"
                << std::endl;
      finish(true);
      return 0;
    }
    if (!client.Failure().empty() || launcher_done) {
      const std::string why = failure_text();
      finish(true);
      std::cerr << "afd serve: error: "
                << (why.empty() ? "the processes ended before the deployment was up" : why)
                << std::endl;
      return 1;
    }
    if (ready_by.expired()) {
      client.WaitReady(0);  // names the replicas that never connected
      client.SetFailure(fmt::format("the deployment was not up within {} s", o.ready_timeout_s));
      finish(true);
      std::cerr << "afd serve: error: " << client.Failure() << std::endl;
      return 1;
    }
  }
  ApiServer api(o.api, client, tok.tokenizer.get(), tok.chat_template.get());
  try {
    api.Start();
  } catch (const Error& e) {
    client.SetFailure(e.what());
    client.Shutdown();
    finish(true);
    std::cerr << "afd serve: error: " << e.what() << std::endl;
    return 1;
  }
  std::cerr << Listening(o, api) << std::endl;
  while (true) {
    if (const int sig = WaitStopSignal(0.2)) {
      std::cerr << "afd serve: " << StopSignalName(sig) << ": stopping" << std::endl;
      StopApi(api, o.shutdown_timeout_s);
      client.Shutdown();
      // The replicas finish and leave, then the FFN ranks; past stop_grace_s they are stopped.
      const Deadline leave_by = Deadline::In(o.stop_grace_s);
      while (launcher.joinable() && !launcher_done && !leave_by.expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const bool left = launcher_done || !launcher.joinable();
      finish(!left);
      if (!left) {
        std::cerr << fmt::format(
                         "afd serve: the processes had not ended {} s after the shutdown: "
                         "stopped them (SIGTERM)",
                         o.stop_grace_s)
                  << std::endl;
      }
      if (!launcher_error.empty()) {
        std::cerr << "afd serve: error while stopping: " << launcher_error << std::endl;
        return 1;
      }
      std::cerr << "afd serve: stopped" << std::endl;
      return 0;
    }
    if (!client.Failure().empty() || launcher_done) {
      const std::string why = failure_text();
      api.Stop();
      finish(true);
      std::cerr << "afd serve: error: "
                << (why.empty() ? "the deployment's processes ended on their own" : why)
                << std::endl;
      return 1;
    }
  }
}

}  // namespace afd::server

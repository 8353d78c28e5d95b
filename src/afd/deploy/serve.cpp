#include "afd/deploy/serve.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "afd/common/error.h"
#include "afd/common/stop_signals.h"
#include "afd/common/temp_dir.h"
#include "afd/deploy/launcher.h"
#include "afd/deploy/role_worker.h"

namespace afd::deploy {

std::vector<RankProcessSpec> ServeRankSpecs(const ServeOptions& o, std::string* log_dir) {
  const WorkerOptions& base = o.base;
  AFD_CHECK(o.dp_local >= 1 && o.dp_start + o.dp_local <= base.dp,
            "--data-parallel-start-rank {} + --data-parallel-size-local {} exceed "
            "--data-parallel-size {}",
            o.dp_start, o.dp_local, base.dp);
  const std::string dir = o.log_dir.empty() ? MakePrivateTempDir("afd-serve-") : o.log_dir;
  std::filesystem::create_directories(dir);
  const std::string role(RoleName(base.config.role));
  const int local_ranks = o.dp_local * base.tp;
  AFD_CHECK(o.cuda_devices.empty() || static_cast<int>(o.cuda_devices.size()) == local_ranks,
            "--cuda-devices: {} devices for the {} {} ranks of this host (one per rank, in rank "
            "order)",
            o.cuda_devices.size(), local_ranks, role);
  std::vector<RankProcessSpec> specs;
  for (int d = o.dp_start; d < o.dp_start + o.dp_local; ++d) {
    for (int t = 0; t < base.tp; ++t) {
      const int rank = d * base.tp + t;
      RankProcessSpec s;
      s.label = fmt::format("{} rank {}", role, rank);
      s.log = fmt::format("{}/{}{}.log", dir, role, rank);
      s.argv = {SelfExe(),
                "worker",
                "--exit-with-parent",
                std::to_string(getpid()),
                "--role-rank",
                std::to_string(rank)};
      for (const auto& f : o.worker_flags) s.argv.push_back(f);
      if (!o.cuda_devices.empty()) {
        const int device = o.cuda_devices[specs.size()];
        s.argv.insert(s.argv.end(), {"--cuda-device", std::to_string(device)});
        s.label += fmt::format(" (cuda:{})", device);
      }
      if (!o.output_file.empty() && t == 0) {
        s.argv.insert(s.argv.end(), {"--output-file", fmt::format("{}/out{}.jsonl", dir, d)});
      }
      s.serves_engine = base.config.role == Role::kAttention && base.prompts.empty();
      if (s.serves_engine && !o.engine_endpoint.empty()) {
        s.argv.insert(s.argv.end(), {"--engine-endpoint", o.engine_endpoint});
      }
      specs.push_back(std::move(s));
    }
  }
  std::cerr << "afd serve: " << specs.size() << " " << role << " rank(s), logs in " << dir
            << std::endl;
  *log_dir = dir;
  return specs;
}

bool ServeRole(const ServeOptions& o) {
  std::string dir;
  const std::vector<RankProcessSpec> specs = ServeRankSpecs(o, &dir);
  // SIGINT / SIGTERM (blocked by the caller) stop the ranks: a watcher thread takes them. The
  // same thread writes the ready file once every rank's log says it joined.
  std::atomic<bool> stop{false}, done{false};
  bool ready = o.ready_file.empty();
  std::thread watcher([&] {
    while (!done) {
      if (!ready) {
        int joined = 0;
        for (const RankProcessSpec& s : specs) {
          std::ifstream log(s.log);
          std::stringstream text;
          text << log.rdbuf();
          joined += text.str().find(kJoinedLine) != std::string::npos ? 1 : 0;
        }
        if (joined == static_cast<int>(specs.size())) {
          const std::string tmp = o.ready_file + ".tmp";
          std::ofstream(tmp) << specs.size() << " rank(s) of this host joined the deployment\n";
          std::rename(tmp.c_str(), o.ready_file.c_str());
          ready = true;
        }
      }
      if (const int sig = WaitStopSignal(0.1)) {
        std::cerr << "afd serve: " << StopSignalName(sig) << ": stopping the " << specs.size()
                  << " rank(s) of this host" << std::endl;
        stop = true;
        return;
      }
    }
  });
  bool stopped = false;
  try {
    stopped = RunRankProcesses(specs, 300, &stop, o.stop_grace_s);
  } catch (...) {
    done = true;
    watcher.join();
    if (!o.ready_file.empty()) std::remove(o.ready_file.c_str());
    throw;
  }
  done = true;
  watcher.join();
  if (!o.ready_file.empty()) std::remove(o.ready_file.c_str());
  if (stopped) {
    std::cerr << "afd serve: stopped" << std::endl;
    return true;
  }
  if (o.output_file.empty()) return false;
  std::string merged;
  for (int d = o.dp_start; d < o.dp_start + o.dp_local; ++d) {
    const std::string part = fmt::format("{}/out{}.jsonl", dir, d);
    std::ifstream in(part);
    AFD_CHECK(in.is_open(), "attention replica {} wrote no results ({} is missing)", d, part);
    std::stringstream text;
    text << in.rdbuf();  // an empty file (a replica without prompts) adds nothing
    merged += text.str();
  }
  std::ofstream out(o.output_file, std::ios::trunc);
  out << merged;
  out.close();
  AFD_CHECK(out.good(), "--output-file {}: cannot write", o.output_file);
  return false;
}

}  // namespace afd::deploy

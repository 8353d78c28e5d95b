// Starting the rank processes of a deployment on this host and watching them: used by
// `afd serve` (the ranks of one role on one host) and `afd run --topology` (every rank).
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace afd::deploy {

struct RankProcessSpec {
  std::string label;              // "attention rank 1", "ffn rank 0"
  std::vector<std::string> argv;  // argv[0]: the afd binary
  std::string log;                // stdout + stderr of the process
  // An attention rank of a serving deployment: whoever starts it adds --engine-endpoint.
  bool serves_engine = false;
};

// Starts every process and waits until all have exited. When one fails (non-zero exit or a
// signal), the others get a short grace period to fail on their own -- they name the lost peer
// -- then are killed, and afd::Error names the process that failed first (a process killed by a
// signal counts as the root cause before those that exited with an error), with the tail of
// its log. No process outlives this call. Unless already set, OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS give each process its share of this host's cores. Once one process has
// finished cleanly, the others must finish within finish_bound_s, or they are stopped and
// afd::Error names them.
// When `stop` becomes true, every process still running gets SIGTERM and this returns true once
// all have ended; those still running stop_grace_s later are killed and afd::Error names them.
// Returns false when every process finished on its own.
bool RunRankProcesses(const std::vector<RankProcessSpec>& specs, double finish_bound_s = 300,
                      const std::atomic<bool>* stop = nullptr, double stop_grace_s = 10);

// Makes the kernel send SIGKILL to this process when its parent ends (a launcher that was
// killed), so no rank outlives its launcher; exits at once if the parent is no longer
// `launcher_pid` (it ended before this call).
void ExitWithParent(int launcher_pid);

// Path of the running afd binary (/proc/self/exe).
std::string SelfExe();

// Last `max_lines` lines of a file ("" if unreadable).
std::string TailOfFile(const std::string& path, int max_lines);

}  // namespace afd::deploy

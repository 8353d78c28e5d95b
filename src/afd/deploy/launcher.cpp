#include "afd/deploy/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "afd/common/error.h"
#include "afd/common/subprocess.h"

namespace afd::deploy {

void ExitWithParent(int launcher_pid) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher_pid) _exit(1);  // the launcher ended before the line above
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  AFD_CHECK(n > 0, "cannot find the afd binary (/proc/self/exe)");
  return std::string(buf, n);
}

std::string TailOfFile(const std::string& path, int max_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& l : lines) out += "    " + l + "\n";
  return out;
}

namespace {

std::string StatusText(const Subprocess& p, int status) {
  if (p.term_signal() != 0) {
    return fmt::format("was killed by signal {} ({})", p.term_signal(), strsignal(p.term_signal()));
  }
  return fmt::format("exited with status {}", status);
}

// A rank that failed because another one did says so in its last words (role_worker.cpp).
bool FailedBecauseOfAnother(const std::string& log) {
  return TailOfFile(log, 20).find("(the deployment was aborted:") != std::string::npos;
}

}  // namespace

bool RunRankProcesses(const std::vector<RankProcessSpec>& specs, double finish_bound_s,
                      const std::atomic<bool>* stop, double stop_grace_s) {
  // The ranks share this host's cores: give each its share of BLAS/OpenMP threads (unless the
  // user chose), or their spinning threads starve each other (26x slower decode seen on 2 cores).
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads =
      std::to_string(std::max<size_t>(1, cores / std::max<size_t>(1, specs.size())));
  setenv("OMP_NUM_THREADS", threads.c_str(), /*overwrite=*/0);
  setenv("OPENBLAS_NUM_THREADS", threads.c_str(), /*overwrite=*/0);
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (const auto& s : specs) procs.push_back(std::make_unique<Subprocess>(s.argv, s.log));
  // Wait for all, or for the first failure. Once one process has finished cleanly, the others
  // must finish within finish_bound_s: the ranks of a deployment end together.
  int first_failed = -1, first_finished = -1;
  std::optional<Deadline> finish_deadline;
  while (first_failed < 0) {
    bool all_done = true;
    for (size_t i = 0; i < procs.size(); ++i) {
      const std::optional<int> st = procs[i]->Poll();
      if (st && *st != 0 && first_failed < 0) first_failed = static_cast<int>(i);
      if (st && *st == 0 && first_finished < 0) {
        first_finished = static_cast<int>(i);
        finish_deadline = Deadline::In(finish_bound_s);
      }
      all_done &= st.has_value();
    }
    if (first_failed >= 0 || all_done) break;
    if (stop && stop->load()) {
      // A stop request: SIGTERM to each process still running (each stops at once, docs/
      // reliability.md), then SIGKILL for any still there after stop_grace_s.
      for (auto& p : procs) {
        if (!p->Poll()) p->Kill(SIGTERM);
      }
      const Deadline grace = Deadline::In(stop_grace_s);
      std::string killed;
      for (size_t i = 0; i < procs.size(); ++i) {
        if (!procs[i]->Wait(grace)) {
          killed += fmt::format(" {} (pid {});", specs[i].label, procs[i]->pid());
        }
      }
      procs.clear();  // kills and reaps whatever is left
      AFD_CHECK(killed.empty(),
                "stopped; these processes did not end within {}s of SIGTERM and "
                "were killed:{}",
                stop_grace_s, killed);
      return true;
    }
    if (finish_deadline && finish_deadline->expired()) {
      std::string running;
      for (size_t i = 0; i < procs.size(); ++i) {
        if (!procs[i]->Poll()) {
          running += fmt::format("  {} (pid {}); last log lines:\n{}", specs[i].label,
                                 procs[i]->pid(), TailOfFile(specs[i].log, 3));
        }
      }
      procs.clear();  // kills and reaps whatever is left
      AFD_THROW(
          "{} finished, but these processes were still running {}s later and have been "
          "stopped:\n{}",
          specs[first_finished].label, finish_bound_s, running);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (first_failed < 0) return false;
  // Grace period: the peers of a dead process notice it and exit naming it.
  const Deadline grace = Deadline::In(3.0);
  for (auto& p : procs) p->Wait(grace);
  // The root cause: a process killed by a signal, else one that failed on its own account
  // (not "the deployment was aborted: ..."), else the first failure seen.
  auto failed = [&](size_t i) {
    const std::optional<int> st = procs[i]->Poll();
    return st && *st != 0;
  };
  int culprit = -1;
  for (size_t i = 0; i < procs.size() && culprit < 0; ++i) {
    if (failed(i) && procs[i]->term_signal() != 0) culprit = static_cast<int>(i);
  }
  for (size_t i = 0; i < procs.size() && culprit < 0; ++i) {
    if (failed(i) && !FailedBecauseOfAnother(specs[i].log)) culprit = static_cast<int>(i);
  }
  if (culprit < 0) culprit = first_failed;
  std::string others;
  for (size_t i = 0; i < procs.size(); ++i) {
    const std::optional<int> st = procs[i]->Poll();
    if (static_cast<int>(i) == culprit) continue;
    if (!st) {
      others += fmt::format("  {} (pid {}) was still running and has been stopped\n",
                            specs[i].label, procs[i]->pid());
    } else if (*st != 0) {
      others +=
          fmt::format("  {} (pid {}) {}; last log lines:\n{}", specs[i].label, procs[i]->pid(),
                      StatusText(*procs[i], *st), TailOfFile(specs[i].log, 3));
    }
  }
  const std::string status = StatusText(*procs[culprit], *procs[culprit]->Poll());
  const std::string pid = std::to_string(procs[culprit]->pid());
  procs.clear();  // kills and reaps whatever is left
  AFD_THROW("{} (pid {}) {}; last log lines ({}):\n{}{}", specs[culprit].label, pid, status,
            specs[culprit].log, TailOfFile(specs[culprit].log, 6),
            others.empty() ? "" : "the other processes:\n" + others);
}

}  // namespace afd::deploy

// Child processes for launchers and multi-process tests: spawn with output to a file, wait with
// a deadline, kill whatever is left. No child outlives its Subprocess object.
//
// Thread safety: one thread at a time per object.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "afd/common/deadline.h"

namespace afd {

class Subprocess {
 public:
  // Starts argv[0] (searched in PATH) with stdout and stderr appended to `log_path`
  // ("" = inherit). The child gets its own process group so kills reach its children too.
  // Throws afd::Error when the program cannot be started.
  Subprocess(std::vector<std::string> argv, const std::string& log_path);
  ~Subprocess();  // kills (SIGKILL) and reaps the child if it is still running
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Exit status if the child has ended: the exit code, or 128 + signal number (as a shell
  // reports it; term_signal() tells the two apart).
  std::optional<int> Poll();
  // The signal that ended the child, 0 if it exited (or has not ended).
  int term_signal() const { return term_signal_; }
  // Waits until the child ends or the deadline passes; returns the status or nullopt.
  std::optional<int> Wait(const Deadline& deadline);
  void Kill(int signal);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  int term_signal_ = 0;
};

}  // namespace afd

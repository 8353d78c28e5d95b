#include "afd/common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "afd/common/error.h"

extern char** environ;

namespace afd {

Subprocess::Subprocess(std::vector<std::string> argv, const std::string& log_path) {
  AFD_CHECK(!argv.empty(), "subprocess: empty command line");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group (a Ctrl-C to the launcher's terminal reaches the launcher only),
  // no blocked signals (a server blocks SIGINT/SIGTERM in its threads to wait for them), and
  // default handlers.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  const int rc = posix_spawnp(&pid_, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  AFD_CHECK(rc == 0, "cannot start {}: {}", argv[0], std::strerror(rc));
}

Subprocess::~Subprocess() {
  if (!Poll()) {
    Kill(SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

std::optional<int> Subprocess::Poll() {
  if (status_) return status_;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    term_signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  } else if (r < 0 && errno == ECHILD) {
    status_ = 255;  // reaped elsewhere; treat as failed
  }
  return status_;
}

std::optional<int> Subprocess::Wait(const Deadline& deadline) {
  while (!Poll()) {
    if (deadline.expired()) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_;
}

void Subprocess::Kill(int signal) {
  if (status_) return;
  ::kill(-pid_, signal);  // the whole process group
  ::kill(pid_, signal);
}

}  // namespace afd

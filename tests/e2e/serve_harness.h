// Helpers of the serving end-to-end tests (serve_e2e_test.cpp): the real `afd launch` / `afd
// serve` as a child process, JSON and SSE over HTTP, /proc scans for its rank processes, and
// `afd run` as the reference.
//
// Ports: the server is started with --port 0, binds an ephemeral port itself and names it in its
// "the OpenAI API is up on http://HOST:PORT" line, so no port is picked here and no bind can race
// with another process (nothing to retry). Every wait has a deadline; a ServedProcess kills its
// launcher and every rank of it (found in /proc) and removes its folder when it goes, and the
// launcher is started under `setpriv --pdeathsig KILL` so that it dies with the test process.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "afd/common/deadline.h"
#include "afd/common/subprocess.h"
#include "testing/files.h"

namespace afd::e2e {

using json = nlohmann::json;
using testing_util::ReadFile;

// ---- processes -------------------------------------------------------------------------------

// The NUL-separated command line of a process (empty for a zombie or a process that is gone).
inline std::vector<std::string> ProcessArgs(pid_t pid) {
  const std::string raw = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> args;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t end = raw.find('\0', pos);
    args.push_back(raw.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return args;
}

struct RankProcess {
  pid_t pid;
  std::vector<std::string> args;
  bool Has(const std::string& flag, const std::string& value) const {
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == flag && args[i + 1] == value) return true;
    }
    return false;
  }
  bool Mentions(const std::string& text) const {
    for (const auto& a : args) {
      if (a.find(text) != std::string::npos) return true;
    }
    return false;
  }
};

// Live processes started by `launcher` (their command line holds "--exit-with-parent PID").
inline std::vector<RankProcess> RankProcessesOf(pid_t launcher) {
  std::vector<RankProcess> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (const dirent* e = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    RankProcess p{static_cast<pid_t>(pid), ProcessArgs(static_cast<pid_t>(pid))};
    if (p.Has("--exit-with-parent", std::to_string(launcher))) out.push_back(std::move(p));
  }
  closedir(proc);
  return out;
}

// A server process (`afd launch` or `afd serve`) on 127.0.0.1 and an ephemeral port, with its
// output in DIR/afd.log and its rank logs under DIR/ranks; DIR is removed at the end.
class ServedProcess {
 public:
  // Starts `afd <args> --host 127.0.0.1 --port 0 --log-dir DIR/ranks` and waits up to
  // ready_timeout_s for its API line; check up() (Log() says why not).
  ServedProcess(const std::string& tag, std::vector<std::string> args,
                double ready_timeout_s = 60) {
    dir_ = ::testing::TempDir() + "/serve_e2e_" + tag + "_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    args.insert(args.begin(), AFD_BINARY);
    // The server dies with this test process even when it cannot run destructors (a crash,
    // SIGPIPE into a closed `| head`, a ctest timeout); its ranks die with it (--exit-with-parent).
    if (std::system("command -v setpriv >/dev/null 2>&1") == 0) {
      args.insert(args.begin(), {"setpriv", "--pdeathsig", "KILL", "--"});
    }
    args.insert(args.end(), {"--host", "127.0.0.1", "--port", "0", "--log-dir", dir_ + "/ranks"});
    proc_ = std::make_unique<Subprocess>(args, dir_ + "/afd.log");
    pid_ = proc_->pid();
    const std::string kUp = "the OpenAI API is up on http://127.0.0.1:";
    const Deadline deadline = Deadline::In(ready_timeout_s);
    while (!deadline.expired() && !proc_->Poll()) {
      const std::string log = Log();
      const size_t at = log.find(kUp);
      if (at != std::string::npos && log.find(' ', at + kUp.size()) != std::string::npos) {
        port_ = std::stoi(log.substr(at + kUp.size()));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~ServedProcess() {
    const std::vector<RankProcess> ranks = RankProcessesOf(pid_);
    proc_.reset();  // SIGKILL to the launcher (if still running) and reaped
    for (const auto& r : ranks) ::kill(r.pid, SIGKILL);
    const Deadline deadline = Deadline::In(10);
    while (!RankProcessesOf(pid_).empty() && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ServedProcess(const ServedProcess&) = delete;
  ServedProcess& operator=(const ServedProcess&) = delete;

  bool up() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string Log() const { return ReadFile(dir_ + "/afd.log"); }
  const std::string& dir() const { return dir_; }
  void Signal(int sig) { proc_->Kill(sig); }
  std::optional<int> Wait(double timeout_s) { return proc_->Wait(Deadline::In(timeout_s)); }

 private:
  std::string dir_;
  std::unique_ptr<Subprocess> proc_;
  int port_ = 0;
  pid_t pid_ = 0;
};

// ---- HTTP ------------------------------------------------------------------------------------

struct Reply {
  int status = 0;  // 0: no HTTP response (see error)
  json body;       // null unless the body is JSON
  std::string raw;
  httplib::Headers headers;
  std::string error;
};

inline std::unique_ptr<httplib::Client> Client(int port, int timeout_s = 60) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_connection_timeout(10, 0);
  c->set_read_timeout(timeout_s, 0);
  c->set_write_timeout(timeout_s, 0);
  return c;
}

inline Reply ToReply(const httplib::Result& r) {
  Reply out;
  if (!r) {
    out.error = httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.raw = r->body;
  out.headers = r->headers;
  out.body = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (out.body.is_discarded()) out.body = nullptr;
  return out;
}

inline Reply PostJson(int port, const std::string& path, const json& body, int timeout_s = 60) {
  return ToReply(Client(port, timeout_s)->Post(path.c_str(), body.dump(), "application/json"));
}

inline Reply Get(int port, const std::string& path) {
  return ToReply(Client(port, 10)->Get(path.c_str()));
}

// A streamed POST: the "data: ..." payloads in order. on_event (optional) sees each payload as it
// arrives; returning false hangs up. The whole exchange is bounded by timeout_s.
struct StreamReply {
  int status = 0;
  std::vector<std::string> events;
  std::string raw;  // the body of a non-200 reply
  bool hung_up = false;
  bool timed_out = false;
  std::string error;  // transport error, "" if none
};

inline StreamReply PostStream(int port, const std::string& path, const json& body,
                              const std::function<bool(const std::string&)>& on_event = nullptr,
                              double timeout_s = 60) {
  StreamReply out;
  const Deadline deadline = Deadline::In(timeout_s);
  std::string buffer;
  auto client = Client(port, static_cast<int>(timeout_s));
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (out.status != 200) {
      out.raw.append(data, n);
      return true;
    }
    buffer.append(data, n);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      out.events.push_back(event.substr(6));
      if (on_event && !on_event(out.events.back())) {
        out.hung_up = true;
        return false;
      }
    }
    if (deadline.expired()) {
      out.timed_out = true;
      return false;
    }
    return true;
  };
  const httplib::Result r = client->send(req);
  if (!r && !out.hung_up && !out.timed_out) out.error = httplib::to_string(r.error());
  return out;
}

// The value of the first series of `name` whose labels contain `label` ("" = any), or -1.
inline double Metric(const std::string& text, const std::string& name,
                     const std::string& label = "") {
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// Polls `done` every 20 ms until it holds or timeout_s passes; returns its last value.
inline bool PollUntil(double timeout_s, const std::function<bool()>& done) {
  const Deadline deadline = Deadline::In(timeout_s);
  while (!done()) {
    if (deadline.expired()) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// ---- the reference ---------------------------------------------------------------------------

// `afd run --model preset:tiny --json --ignore-eos <flags>` with one --prompt-ids per prompt:
// the output ids of each prompt (empty on failure, with the reason in *error).
inline std::vector<std::vector<int>> RunReference(const std::vector<std::vector<int>>& prompts,
                                                  const std::string& flags, std::string* error) {
  std::string cmd =
      std::string(AFD_BINARY) + " run --model preset:tiny --json --ignore-eos " + flags;
  for (const auto& p : prompts) {
    cmd += " --prompt-ids ";
    for (size_t i = 0; i < p.size(); ++i) {
      if (i > 0) cmd += ",";
      cmd += std::to_string(p[i]);
    }
  }
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {};
  std::string text;
  char buf[65536];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) text.append(buf, n);
  const int status = pclose(pipe);
  std::vector<std::vector<int>> out;
  std::stringstream ss(text);
  for (std::string line; status == 0 && std::getline(ss, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("output_ids")) break;
    out.push_back(j["output_ids"].get<std::vector<int>>());
  }
  if (out.size() != prompts.size()) {
    *error = cmd + " failed: " + text;
    return {};
  }
  return out;
}

}  // namespace afd::e2e

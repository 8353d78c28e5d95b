#include "afd/comm/join_secret.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "afd/common/env_switches.h"
#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::comm {

namespace {

std::optional<std::string> Env(const char* name) { return EnvValue(name); }

std::string ReadSecretFile(const std::string& path) {
  struct stat st;
  AFD_CHECK(::stat(path.c_str(), &st) == 0, "{}={}: cannot read the join secret file: {}",
            kJoinSecretFileEnv, path, std::strerror(errno));
  AFD_CHECK(S_ISREG(st.st_mode), "{}={}: not a regular file", kJoinSecretFileEnv, path);
  AFD_CHECK((st.st_mode & 077) == 0,
            "{}={}: the join secret file is readable or writable by other users (mode {:o}); "
            "chmod 600 it",
            kJoinSecretFileEnv, path, st.st_mode & 0777);
  std::ifstream in(path, std::ios::binary);
  AFD_CHECK(in.good(), "{}={}: cannot open the join secret file", kJoinSecretFileEnv, path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string secret = ss.str();
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  return secret;
}

}  // namespace

std::optional<std::string> LoadJoinSecret() {
  const std::optional<std::string> direct = Env(kJoinSecretEnv);
  const std::optional<std::string> file = Env(kJoinSecretFileEnv);
  AFD_CHECK(!(direct && file), "both {} and {} are set; set one", kJoinSecretEnv,
            kJoinSecretFileEnv);
  if (!direct && !file) return std::nullopt;
  const std::string secret = direct ? *direct : ReadSecretFile(*file);
  const std::string source =
      direct ? std::string(kJoinSecretEnv) : fmt::format("{} ({})", kJoinSecretFileEnv, *file);
  AFD_CHECK(secret.size() >= kMinJoinSecretBytes,
            "{}: the join secret has {} bytes; it needs at least {} (e.g. `openssl rand -hex 32`)",
            source, secret.size(), kMinJoinSecretBytes);
  return secret;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0;
}

std::optional<std::string> ResolveJoinSecret(const std::string& host) {
  std::optional<std::string> secret = LoadJoinSecret();
  if (secret) return secret;
  AFD_CHECK(IsLoopbackHost(host),
            "the rendezvous host {} is not a loopback address, so the store would be open to the "
            "network: set the same join secret on every process through {} or {}",
            host, kJoinSecretEnv, kJoinSecretFileEnv);
  static std::once_flag warned;
  std::call_once(warned, [] {
    std::fprintf(stderr,
                 "afd: warning: no join secret (%s / %s) is set; the rendezvous store accepts any "
                 "process on this host\n",
                 kJoinSecretEnv, kJoinSecretFileEnv);
  });
  return std::nullopt;
}

void EnsureLocalJoinSecret() {
  if (EnvValue(kJoinSecretEnv) || EnvValue(kJoinSecretFileEnv)) return;
  setenv(kJoinSecretEnv, ToHex(RandomBytes(32)).c_str(), /*overwrite=*/0);
}

}  // namespace afd::comm

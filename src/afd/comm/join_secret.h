// The join secret: what every process of a deployment must prove to the rendezvous store
// (HMAC-SHA256 challenge/response, docs/reliability.md) before it may read or write a key.
//
// It comes from the environment only -- never a command-line flag, a config file field or a log
// line: AFD_JOIN_SECRET (the secret itself) or AFD_JOIN_SECRET_FILE (a file holding it, readable
// by its owner only; one trailing newline is stripped). Setting both is an error. A secret has
// at least kMinJoinSecretBytes bytes.
//
// Policy when neither is set (ResolveJoinSecret): a deployment whose rendezvous host is a
// loopback address runs without one (the store then listens on loopback only) and says so once
// on stderr; any other host is refused, because the store would be open to the network.
// `afd run --topology` and `afd launch`, which start every rank themselves, generate a fresh
// secret for their children (EnsureLocalJoinSecret); a per-role `afd serve` never does, since
// its ranks join a store another command started.
#pragma once

#include <optional>
#include <string>

namespace afd::comm {

inline constexpr const char* kJoinSecretEnv = "AFD_JOIN_SECRET";
inline constexpr const char* kJoinSecretFileEnv = "AFD_JOIN_SECRET_FILE";
inline constexpr size_t kMinJoinSecretBytes = 16;

// The secret from the environment, nullopt when neither variable is set. Throws afd::Error
// naming the variable (or file) when it is unusable: both set, too short, unreadable file, or a
// file that other users can read.
std::optional<std::string> LoadJoinSecret();

// LoadJoinSecret() plus the policy above for the deployment whose store is at `host`. Throws
// afd::Error naming the host and the two variables when a non-loopback deployment has none.
std::optional<std::string> ResolveJoinSecret(const std::string& host);

// True for 127.0.0.0/8 and "localhost".
bool IsLoopbackHost(const std::string& host);

// Sets AFD_JOIN_SECRET to a fresh random secret unless one of the variables is already set, so
// the child processes a single-host launcher starts (which inherit the environment) share it.
void EnsureLocalJoinSecret();

}  // namespace afd::comm

// The one registry of afd's environment variables (NCCL_PARAM's idea): every AFD_* variable is
// declared once in env_switches.cpp with what it takes, what happens while it is unset, and one
// line of meaning; code reads them only through the functions below (a name that is not
// registered is an error, so a typo cannot silently read nothing), `afd --help-env` prints the
// table and docs/config.md lists it (tests/common/env_switches_test.cpp checks both, and that
// no source file reads the environment elsewhere).
//
// Kernel switches are read once by their call sites (static locals): set them before the
// process starts. Thread safety: the functions may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace afd {

struct EnvSwitch {
  const char* name;     // AFD_...
  const char* values;   // what it takes, e.g. "0", "1..16", "portable, avx2 or avx512"
  const char* unset;    // what happens while it is unset (the default)
  const char* meaning;  // one line
};

// Every switch, sorted by name.
std::span<const EnvSwitch> EnvSwitches();

// The value of registered variable `name`; nullopt when unset. Throws afd::Error for a name
// that is not registered.
std::optional<std::string> EnvValue(std::string_view name);
// Whether `name` is set to "0" (a kernel form turned off).
bool EnvOff(std::string_view name);
// `name` as a whole number in 1..max, 0 when unset or empty; anything else throws naming it.
int64_t EnvCount(std::string_view name, int64_t max);

// The table `afd --help-env` prints (docs/config.md holds the same).
std::string EnvSwitchesHelp();

}  // namespace afd

// Error style of the library: every failure is an afd::Error carrying a message written for the
// user (what failed, which field/file/rank, and why) plus the source location that raised it.
// Binaries catch it at the top, print the message and exit non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace afd {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line)
      : std::runtime_error(message), file_(file), line_(line) {}

  // "file:line" of the code that raised the error, for debugging.
  std::string where() const;

 private:
  const char* file_;
  int line_;
};

}  // namespace afd

// AFD_THROW("port {} is taken", port): throws afd::Error with a fmt-formatted message.
#define AFD_THROW(...) throw ::afd::Error(::fmt::format(__VA_ARGS__), __FILE__, __LINE__)

// AFD_CHECK(cond, "message {}", arg): throws afd::Error with the message when cond is false.
#define AFD_CHECK(cond, ...)  \
  do {                        \
    if (!(cond)) {            \
      AFD_THROW(__VA_ARGS__); \
    }                         \
  } while (0)

// Small file helpers shared by the multi-process tests.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace afd::testing_util {

// The whole file, or "" when it cannot be read (a log a process never wrote).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace afd::testing_util

// CLI11 validators with messages that say what a flag wants (CLI11's PositiveNumber prints its
// range as "0.000000 to 1.797...e+308").
#pragma once

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

namespace afd::cli {

// A number > 0 (integers and reals alike; the option's own type still parses it).
inline CLI::Validator Positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !(v > 0)) {
          return "must be a positive number, got \"" + text + "\"";
        }
        return std::string();
      },
      "POSITIVE");
}

}  // namespace afd::cli

#include "afd/config/json_fields.h"

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "afd/common/error.h"

namespace afd::json_fields {

using nlohmann::json;

json ParseStrict(std::string_view text, std::string_view what) {
  // Track the keys seen in each open object so a repeated key is an error, not a silent overwrite.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json value;
  try {
    value = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    // parse_error, but also out_of_range (a number like 1e400 overflows a double).
    AFD_THROW("{} is not valid JSON: {}", what, e.what());
  }
  AFD_CHECK(duplicate.empty(), "{}: key \"{}\" appears more than once in one object", what,
            duplicate);
  return value;
}

std::string Describe(const json& value) {
  // Invalid UTF-8 in a string is replaced, not thrown: a message about bad input must not fail.
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("{} {}", value.type_name(), text);
}

int64_t GetInt(const json& value, const std::string& path, int64_t lo, int64_t hi) {
  AFD_CHECK(value.is_number_integer(), "{}: must be an integer in {}..{}, got {}", path, lo, hi,
            Describe(value));
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    AFD_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              "{}: value {} is out of range; must be in {}..{}", path, u, lo, hi);
  }
  const int64_t v = value.get<int64_t>();
  AFD_CHECK(v >= lo && v <= hi, "{}: value {} is out of range; must be in {}..{}", path, v, lo, hi);
  return v;
}

double GetNumber(const json& value, const std::string& path, double lo, double hi) {
  AFD_CHECK(value.is_number(), "{}: must be a number in {}..{}, got {}", path, lo, hi,
            Describe(value));
  const double v = value.get<double>();
  AFD_CHECK(std::isfinite(v) && v >= lo && v <= hi,
            "{}: value {} is out of range; must be a finite number in {}..{}", path, v, lo, hi);
  return v;
}

bool GetBool(const json& value, const std::string& path) {
  AFD_CHECK(value.is_boolean(), "{}: must be true or false, got {}", path, Describe(value));
  return value.get<bool>();
}

std::string GetString(const json& value, const std::string& path) {
  AFD_CHECK(value.is_string(), "{}: must be a string, got {}", path, Describe(value));
  return value.get<std::string>();
}

}  // namespace afd::json_fields

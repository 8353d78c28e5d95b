// Strict typed readers for JSON fields, shared by the config parsers. JSON stays out of public
// headers of other layers; only config/*.cpp include this file.
//
// Every reader throws afd::Error whose message starts with the field's path ("afd.port: ...").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace afd::json_fields {

// Parses text as JSON, rejecting duplicate object keys. `what` names the input in errors.
nlohmann::json ParseStrict(std::string_view text, std::string_view what);

// Short description of a JSON value for error messages: its type and (truncated) text.
std::string Describe(const nlohmann::json& value);

int64_t GetInt(const nlohmann::json& value, const std::string& path, int64_t lo, int64_t hi);
double GetNumber(const nlohmann::json& value, const std::string& path, double lo, double hi);
bool GetBool(const nlohmann::json& value, const std::string& path);
std::string GetString(const nlohmann::json& value, const std::string& path);

}  // namespace afd::json_fields

#include "afd/server/api/json_fields.h"

#include <cmath>
#include <cstdint>

#include "afd/server/api/api_error.h"

namespace afd::server::api {

const json* FindField(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t IntField(const json& body, const char* name, int64_t default_value) {
  const json* v = FindField(body, name);
  if (v == nullptr) return default_value;
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    ThrowBadRequest(name, "'{}' must be an integer below 2^63, got {}", name, v->dump());
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  // 2.0 is accepted as 2 (Python clients may send floats); 2.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
      return static_cast<int64_t>(d);
    }
  }
  ThrowBadRequest(name, "'{}' must be an integer, got {}", name, v->dump());
}

double NumberField(const json& body, const char* name, double default_value) {
  const json* v = FindField(body, name);
  if (v == nullptr) return default_value;
  if (!v->is_number()) ThrowBadRequest(name, "'{}' must be a number, got {}", name, v->dump());
  return v->get<double>();
}

bool BoolField(const json& body, const char* name, bool default_value) {
  const json* v = FindField(body, name);
  if (v == nullptr) return default_value;
  if (!v->is_boolean()) ThrowBadRequest(name, "'{}' must be a boolean, got {}", name, v->dump());
  return v->get<bool>();
}

std::string StringField(const json& body, const char* name, const std::string& default_value) {
  const json* v = FindField(body, name);
  if (v == nullptr) return default_value;
  if (!v->is_string()) ThrowBadRequest(name, "'{}' must be a string, got {}", name, v->dump());
  return v->get<std::string>();
}

json ParseBody(const std::string& body) {
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("malformed JSON in the request body: ") + e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range: a number past double (1e400)
    throw ApiError(400, std::string("the request body's JSON cannot be read: ") + e.what());
  }
  if (!parsed.is_object()) {
    throw ApiError(
        400, "the request body must be a JSON object, got " + std::string(parsed.type_name()));
  }
  return parsed;
}

}  // namespace afd::server::api

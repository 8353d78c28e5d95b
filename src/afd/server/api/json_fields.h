// Typed reads of an OpenAI request body's fields: a field that is absent or null reads as its
// default; one of the wrong type, or out of range, is an ApiError 400 naming the field.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace afd::server::api {

using json = nlohmann::ordered_json;

// The field, or nullptr when it is absent or null (OpenAI clients send null for "not given").
const json* FindField(const json& body, const char* name);

int64_t IntField(const json& body, const char* name, int64_t default_value);
double NumberField(const json& body, const char* name, double default_value);
bool BoolField(const json& body, const char* name, bool default_value);
std::string StringField(const json& body, const char* name, const std::string& default_value);

// Parses a request body: 400 "malformed JSON" unless it is a JSON object.
json ParseBody(const std::string& body);

}  // namespace afd::server::api

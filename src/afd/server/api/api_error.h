// The error an OpenAI endpoint answers with: an HTTP status and vLLM's error body
// {"error": {"message", "type", "param", "code"}}. Request parsing and the endpoint handlers
// throw it; the server turns it into the response (api_server.cpp).
//
// Thread safety: a value type.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace afd::server::api {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "")
      : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)) {}

  int status() const { return status_; }
  const std::string& param() const { return param_; }  // the request field at fault, or ""
  // The OpenAI client's class name for the status ("BadRequestError", "NotFoundError", ...).
  const char* type() const { return TypeForStatus(status_); }

  static const char* TypeForStatus(int status) {
    switch (status) {
      case 400:
        return "BadRequestError";
      case 401:
        return "AuthenticationError";
      case 403:
        return "PermissionDeniedError";
      case 404:
        return "NotFoundError";
      case 413:
        return "RequestTooLargeError";
      case 422:
        return "UnprocessableEntityError";
      case 429:
        return "RateLimitError";
      case 503:
        return "ServiceUnavailableError";
      default:
        return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
  }

 private:
  int status_;
  std::string param_;
};

// ThrowBadRequest("n", "n must be at least 1, got {}.", n): a 400 naming the field.
template <typename... Args>
[[noreturn]] void ThrowBadRequest(const std::string& param, fmt::format_string<Args...> format,
                                  Args&&... args) {
  throw ApiError(400, fmt::format(format, std::forward<Args>(args)...), param);
}

}  // namespace afd::server::api

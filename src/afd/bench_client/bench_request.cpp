#include "afd/bench_client/bench_request.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

namespace afd::bench_client {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// "HTTP 400: <error.message>" from an OpenAI-style error body, else the body's start.
std::string HttpError(int status, const std::string& body) {
  std::string message = body.substr(0, 500);
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error")) {
    const nlohmann::json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      message = e["message"].get<std::string>();
    } else if (e.is_string()) {
      message = e.get<std::string>();
    }
  } else if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    message = j["message"].get<std::string>();
  }
  return message.empty() ? fmt::format("HTTP {}", status)
                         : fmt::format("HTTP {}: {}", status, message);
}

}  // namespace

std::string CompletionRequestBody(const CompletionSettings& settings, const BenchPrompt& prompt) {
  nlohmann::ordered_json j;
  j["model"] = settings.model;
  if (prompt.is_text) {
    j["prompt"] = prompt.text;
  } else {
    j["prompt"] = prompt.ids;
  }
  j["max_tokens"] = prompt.output_len;
  j["temperature"] = settings.temperature;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (settings.ignore_eos) j["ignore_eos"] = true;
  // A text prompt with invalid UTF-8 is sent with U+FFFD in its place, never thrown on.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

RequestOutcome SendCompletion(const HttpStreamClient& client, const std::string& endpoint,
                              const std::string& body, const BenchPrompt& prompt) {
  RequestOutcome out;
  out.prompt_len = prompt.is_text ? 0 : static_cast<int64_t>(prompt.ids.size());
  int64_t chunks = 0;
  int64_t usage_tokens = -1;
  std::string stream_error;
  const Clock::time_point sent = Clock::now();
  Clock::time_point last = sent;
  const auto on_event = [&](const std::string& data) {
    if (data == "[DONE]") return true;
    const Clock::time_point now = Clock::now();
    const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      stream_error = fmt::format("malformed stream event: {}", data.substr(0, 200));
      return false;
    }
    if (j.contains("error")) {
      stream_error = HttpError(200, nlohmann::json{{"error", j["error"]}}.dump());
      return false;
    }
    const auto choices = j.find("choices");
    if (choices != j.end() && choices->is_array() && !choices->empty()) {
      if (chunks == 0) {
        out.ttft_s = Seconds(now - sent);
      } else {
        out.itl_s.push_back(Seconds(now - last));
      }
      last = now;
      ++chunks;
      const nlohmann::json& c = (*choices)[0];
      if (c.is_object() && c.contains("text") && c["text"].is_string()) {
        out.generated_text += c["text"].get<std::string>();
      }
    }
    const auto usage = j.find("usage");
    if (usage != j.end() && usage->is_object()) {
      if (usage->contains("completion_tokens") && (*usage)["completion_tokens"].is_number()) {
        usage_tokens = (*usage)["completion_tokens"].get<int64_t>();
      }
      if (prompt.is_text && usage->contains("prompt_tokens") &&
          (*usage)["prompt_tokens"].is_number()) {
        out.prompt_len = (*usage)["prompt_tokens"].get<int64_t>();
      }
    }
    return true;
  };
  const HttpReply reply = client.PostStream(endpoint, body, on_event);
  out.latency_s = Seconds(last - sent);
  out.output_tokens = usage_tokens > 0 ? usage_tokens : chunks;
  if (!reply.transport_error.empty()) {
    out.error = reply.transport_error;
  } else if (reply.status != 200) {
    out.error = HttpError(reply.status, reply.body);
  } else if (!stream_error.empty()) {
    out.error = stream_error;
  } else if (chunks == 0) {
    out.error = "the stream ended without a content chunk (no TTFT)";
  }
  out.success = out.error.empty();
  return out;
}

}  // namespace afd::bench_client

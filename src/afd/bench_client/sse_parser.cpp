#include "afd/bench_client/sse_parser.h"

namespace afd::bench_client {

std::vector<std::string> SseParser::Feed(std::string_view bytes) {
  std::vector<std::string> events;
  size_t i = 0;
  if (last_was_cr_ && !bytes.empty()) {
    if (bytes[0] == '\n') i = 1;  // the "\n" of a "\r\n" split across pieces
    last_was_cr_ = false;
  }
  while (i < bytes.size()) {
    size_t end = i;
    while (end < bytes.size() && bytes[end] != '\n' && bytes[end] != '\r') ++end;
    if (end == bytes.size()) {
      pending_.append(bytes.substr(i));
      break;
    }
    std::string line = std::move(pending_);
    pending_.clear();
    line.append(bytes.substr(i, end - i));
    TakeLine(line, events);
    if (bytes[end] == '\r') {
      if (end + 1 == bytes.size()) {
        last_was_cr_ = true;
        i = end + 1;
        break;
      }
      if (bytes[end + 1] == '\n') ++end;
    }
    i = end + 1;
  }
  return events;
}

std::vector<std::string> SseParser::Finish() {
  std::vector<std::string> events;
  if (!pending_.empty()) {
    const std::string line = std::move(pending_);
    pending_.clear();
    TakeLine(line, events);
  }
  EndEvent(events);
  return events;
}

void SseParser::TakeLine(std::string_view line, std::vector<std::string>& events) {
  if (line.empty()) {
    EndEvent(events);
    return;
  }
  if (line[0] == ':') return;  // comment (keep-alive)
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  if (field != "data") return;  // event, id, retry: not used by completions streams
  std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

void SseParser::EndEvent(std::vector<std::string>& events) {
  if (has_data_) events.push_back(std::move(data_));
  data_.clear();
  has_data_ = false;
}

}  // namespace afd::bench_client

// Incremental parser of a Server-Sent Events stream (text/event-stream, as OpenAI-compatible
// servers stream completions): bytes arrive in arbitrary pieces, split anywhere (inside a line, a
// UTF-8 sequence or a "\r\n"); complete events come out in order.
// Thread safety: none; one parser per stream.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace afd::bench_client {

class SseParser {
 public:
  // Appends bytes and returns the `data` of every event completed by them (an event ends at a
  // blank line; its "data:" lines are joined with "\n"; comments and other fields are skipped).
  std::vector<std::string> Feed(std::string_view bytes);
  // Ends the stream: returns the data of a last event not closed by a blank line (servers that
  // close the connection right after "data: [DONE]\n"), or nothing.
  std::vector<std::string> Finish();

 private:
  void TakeLine(std::string_view line, std::vector<std::string>& events);
  void EndEvent(std::vector<std::string>& events);

  std::string pending_;  // bytes of a line not yet ended
  std::string data_;     // data of the event being read
  bool has_data_ = false;
  bool last_was_cr_ = false;  // a "\r" ended the previous piece: skip a leading "\n"
};

}  // namespace afd::bench_client

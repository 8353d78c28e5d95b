// The SSE parser of `afd bench serve` on streams split at every byte.
#include <gtest/gtest.h>

#include "afd/bench_client/sse_parser.h"

namespace afd::bench_client {
namespace {

std::vector<std::string> FeedInPieces(const std::string& stream, size_t piece) {
  SseParser parser;
  std::vector<std::string> events;
  for (size_t i = 0; i < stream.size(); i += piece) {
    for (std::string& e : parser.Feed(std::string_view(stream).substr(i, piece))) {
      events.push_back(std::move(e));
    }
  }
  for (std::string& e : parser.Finish()) events.push_back(std::move(e));
  return events;
}

TEST(BenchServeSse, SplitAnywhereGivesTheSameEvents) {
  const std::string stream =
      ": keep-alive\n\n"
      "data: {\"choices\":[{\"text\":\"h\\u00e9\"}]}\n\n"
      "event: message\r\ndata: line one\r\ndata:line two\r\n\r\n"
      "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\r\r"
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {
      "{\"choices\":[{\"text\":\"h\\u00e9\"}]}", "line one\nline two",
      "{\"choices\":[],\"usage\":{\"completion_tokens\":2}}", "[DONE]"};
  for (size_t piece = 1; piece <= stream.size(); ++piece) {
    EXPECT_EQ(FeedInPieces(stream, piece), want) << "pieces of " << piece << " bytes";
  }
}

TEST(BenchServeSse, EventsComeOutAsSoonAsTheyEnd) {
  SseParser parser;
  EXPECT_TRUE(parser.Feed("data: a").empty());
  EXPECT_TRUE(parser.Feed("b\n").empty());
  EXPECT_EQ(parser.Feed("\ndata: c\n"), std::vector<std::string>{"ab"});
  // A last event without its blank line still counts when the stream ends.
  EXPECT_EQ(parser.Finish(), std::vector<std::string>{"c"});
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(BenchServeSse, CrLfSplitBetweenPiecesIsOneLineEnd) {
  SseParser parser;
  EXPECT_TRUE(parser.Feed("data: x\r").empty());
  EXPECT_TRUE(parser.Feed("\n").empty());  // the "\n" of "\r\n", not a blank line
  EXPECT_EQ(parser.Feed("\r\n"), std::vector<std::string>{"x"});
}

}  // namespace
}  // namespace afd::bench_client

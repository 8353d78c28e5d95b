// Splitting a string at delimiter matches with one of HF tokenizers' SplitDelimiterBehavior
// values, shared by the Split, Digits, Whitespace, Metaspace and ByteLevel pre-tokenizers.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace afd::text {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Parses "Removed", "Isolated", ...; throws afd::Error naming `what` otherwise.
SplitBehavior ParseSplitBehavior(const std::string& name, const std::string& what);

// A segment of the input: [begin, end) and whether it is a delimiter match.
struct Segment {
  size_t begin;
  size_t end;
  bool is_match;
};

// Covers [0, size) with the given matches (sorted, non-overlapping) and the gaps between them.
// An empty input gives one non-match segment (0, 0).
std::vector<Segment> SegmentsFromMatches(const std::vector<std::pair<size_t, size_t>>& matches,
                                         size_t size, bool invert);

// Applies the behavior and returns the non-empty [begin, end) ranges to keep, in order.
std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(std::vector<Segment> segments,
                                                          SplitBehavior behavior);

}  // namespace afd::text

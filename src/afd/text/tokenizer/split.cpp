#include "afd/text/tokenizer/split.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::text {

SplitBehavior ParseSplitBehavior(const std::string& name, const std::string& what) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  AFD_THROW("{}: unknown split behavior \"{}\"", what, name);
}

std::vector<Segment> SegmentsFromMatches(const std::vector<std::pair<size_t, size_t>>& matches,
                                         size_t size, bool invert) {
  std::vector<Segment> segments;
  if (size == 0) return {{0, 0, false}};
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) segments.push_back({prev, b, invert});
    segments.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != size) segments.push_back({prev, size, invert});
  return segments;
}

std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(std::vector<Segment> segments,
                                                          SplitBehavior behavior) {
  std::vector<Segment> kept;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      kept = std::move(segments);
      break;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) kept.push_back(s);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const Segment& s : kept) {
    if (s.end > s.begin) ranges.emplace_back(s.begin, s.end);
  }
  return ranges;
}

}  // namespace afd::text

// A point in time after which a remote wait gives up. Every wait on a peer takes one.
#pragma once

#include <chrono>

namespace afd {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // Expires `seconds` from now.
  static Deadline In(double seconds) {
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds)));
  }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  bool expired() const { return Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, INT_MAX/2] for poll().
  int remaining_ms() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now());
    if (left.count() <= 0) return 0;
    return left.count() > (1 << 30) ? (1 << 30) : static_cast<int>(left.count());
  }

 private:
  Clock::time_point at_;
};

}  // namespace afd

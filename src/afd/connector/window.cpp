#include "afd/connector/window.h"

#include <sched.h>

#include <chrono>
#include <thread>
#include <vector>

namespace afd::connector {

int WaitForFlags(const Window& w, size_t offset, std::span<const uint64_t> seen, int start,
                 const Deadline& deadline, const std::function<void()>& on_idle,
                 double idle_period_s) {
  const int n = static_cast<int>(seen.size());
  if (n == 0) return -1;
  std::vector<uint64_t> now(n);
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();
  auto next_idle = begin + std::chrono::duration<double>(idle_period_s);
  int64_t polls = 0;
  while (true) {
    w.ReadFlags(offset, now);
    for (int i = 0; i < n; ++i) {
      const int f = (start + i) % n;
      if (now[f] != seen[f]) return f;
    }
    ++polls;
    // Spin for the first few microseconds (a reply is often that close), then yield, then give
    // the core away: several ranks may share this host's cores. A host with cores to spare (a
    // GPU node) yields for longer before it sleeps: a sleep costs tens of microseconds of
    // latency per layer.
    if (polls < 256) continue;
    static const auto yield_for =
        std::chrono::microseconds(std::thread::hardware_concurrency() >= 8 ? 2000 : 200);
    const auto t = Clock::now();
    if (t - begin < yield_for) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::microseconds(t - begin < std::chrono::milliseconds(5) ? 20 : 200));
    }
    if (t >= next_idle) {
      on_idle();
      next_idle = Clock::now() + std::chrono::duration<double>(idle_period_s);
    }
    if (deadline.expired()) {
      // One last look: the flag may have arrived while on_idle ran.
      w.ReadFlags(offset, now);
      for (int i = 0; i < n; ++i) {
        const int f = (start + i) % n;
        if (now[f] != seen[f]) return f;
      }
      return -1;
    }
  }
}

}  // namespace afd::connector

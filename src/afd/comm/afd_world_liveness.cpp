// Liveness of an AfdWorld: the heartbeat thread, world rank 0's watch over every rank's
// heartbeat, and naming the root cause when a group operation fails (afd_world.h).
#include <algorithm>
#include <chrono>
#include <thread>

#include "afd/comm/afd_world.h"
#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"

namespace afd::comm {

void AfdWorld::ExplainFailure(const Error& e) {
  if (std::string(e.what()).find("(the deployment was aborted:") != std::string::npos) return;
  // The heartbeat watch may be a moment from naming a stopped rank: give it that moment.
  const Deadline grace = Deadline::In(std::min(3 * heartbeat_interval_s(), 2.0));
  while (true) {
    if (std::optional<std::string> cause = AbortMessage()) {
      AFD_THROW("{} (the deployment was aborted: {})", e.what(), *cause);
    }
    if (grace.expired()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

double AfdWorld::heartbeat_silence_s() const {
  return std::max<double>(request_.config.afd_process_group_timeout_s, 2.0);
}

double AfdWorld::heartbeat_interval_s() const {
  return std::clamp(request_.config.afd_process_group_timeout_s / 10.0, 0.05, 1.0);
}

void AfdWorld::StartHeartbeat() {
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

void AfdWorld::HeartbeatLoop() {
  const int n = topology_.world_size();
  std::vector<std::string> last_value(n);
  std::vector<std::chrono::steady_clock::time_point> last_change(n,
                                                                 std::chrono::steady_clock::now());
  bool watching = world_rank_ == 0;
  const auto interval = std::chrono::duration<double>(heartbeat_interval_s());
  auto last_round = std::chrono::steady_clock::now();
  while (true) {
    try {
      client_->Add(fmt::format("hb/{}", world_rank_), 1);
      const auto now = std::chrono::steady_clock::now();
      if (now - last_round > 3 * interval) {
        // This thread itself was starved (an overloaded host): it cannot judge the others'
        // silence, so their clocks restart.
        std::fill(last_change.begin(), last_change.end(), now);
      }
      last_round = now;
      if (watching) watching = WatchHeartbeats(last_value, last_change);
    } catch (const Error&) {
      return;  // the store is gone: every wait of this rank notices that on its own
    }
    MutexLock lock(heartbeat_mu_);
    const auto until = std::chrono::steady_clock::now() + interval;
    while (!heartbeat_stop_ && heartbeat_cv_.wait_until(lock, until) != std::cv_status::timeout) {
    }
    if (heartbeat_stop_) return;
  }
}

bool AfdWorld::WatchHeartbeats(std::vector<std::string>& last_value,
                               std::vector<std::chrono::steady_clock::time_point>& last_change) {
  const auto now = std::chrono::steady_clock::now();
  const double bound = heartbeat_silence_s();
  for (int w = 0; w < topology_.world_size(); ++w) {
    const std::string value = client_->TryGet(fmt::format("hb/{}", w)).value_or("");
    if (value != last_value[w]) {
      last_value[w] = value;
      last_change[w] = now;
      continue;
    }
    if (std::chrono::duration<double>(now - last_change[w]).count() < bound) continue;
    if (client_->TryGet(fmt::format("hb_done/{}", w))) continue;  // it left on purpose
    Abort(
        fmt::format("{} sent no heartbeat for {}s (the process is stopped or hung, or its "
                    "host is cut off)",
                    Describe(w), bound));
    return false;
  }
  return true;
}

}  // namespace afd::comm

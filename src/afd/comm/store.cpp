#include "afd/comm/store.h"

#include <chrono>
#include <thread>

#include "afd/common/error.h"

namespace afd::comm {

void Store::Wait(const std::vector<std::string>& keys, double timeout_s) {
  const Deadline deadline = Deadline::In(timeout_s);
  int sleep_ms = 1;
  while (true) {
    const std::vector<bool> present = Check(keys);
    std::string missing;
    int num_missing = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (present[i]) continue;
      if (num_missing < 16) missing += (missing.empty() ? "" : ", ") + keys[i];
      ++num_missing;
    }
    if (num_missing == 0) return;
    if (deadline.expired()) {
      AFD_THROW("timed out after {}s waiting for {} rendezvous key(s): {}{}", timeout_s,
                num_missing, missing, num_missing > 16 ? ", ..." : "");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 50);
  }
}

std::string Store::Get(const std::string& key, double timeout_s) {
  Wait({key}, timeout_s);
  std::optional<std::string> value = TryGet(key);
  AFD_CHECK(value.has_value(), "rendezvous key {} vanished while being read", key);
  return *value;
}

void PrefixStore::Set(const std::string& key, const std::string& value) {
  base_.Set(prefix_ + key, value);
}
std::optional<std::string> PrefixStore::TryGet(const std::string& key) {
  return base_.TryGet(prefix_ + key);
}
int64_t PrefixStore::Add(const std::string& key, int64_t delta) {
  return base_.Add(prefix_ + key, delta);
}
bool PrefixStore::Delete(const std::string& key) { return base_.Delete(prefix_ + key); }
std::vector<bool> PrefixStore::Check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return base_.Check(full);
}

}  // namespace afd::comm

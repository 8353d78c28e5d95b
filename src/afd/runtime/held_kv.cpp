#include "afd/runtime/held_kv.h"

namespace afd::runtime {

void HeldKvStore::ExpireLocked(Clock::time_point now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    bytes_ -= static_cast<int64_t>(it->second.rows->bytes.size());
    it = entries_.erase(it);
  }
}

bool HeldKvStore::Fits(int64_t bytes) {
  MutexLock lock(mu_);
  ExpireLocked(Clock::now());
  return bytes <= max_bytes_ - bytes_;
}

void HeldKvStore::Put(uint64_t id, std::shared_ptr<const KvRows> rows, Clock::time_point deadline) {
  MutexLock lock(mu_);
  auto& e = entries_[id];
  if (e.rows) bytes_ -= static_cast<int64_t>(e.rows->bytes.size());
  bytes_ += static_cast<int64_t>(rows->bytes.size());
  e = {std::move(rows), deadline};
}

std::shared_ptr<const KvRows> HeldKvStore::Find(uint64_t id) {
  MutexLock lock(mu_);
  ExpireLocked(Clock::now());
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.rows;
}

bool HeldKvStore::Erase(uint64_t id) {
  MutexLock lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= static_cast<int64_t>(it->second.rows->bytes.size());
  entries_.erase(it);
  return true;
}

void HeldKvStore::Expire() {
  MutexLock lock(mu_);
  ExpireLocked(Clock::now());
}

int64_t HeldKvStore::count() const {
  MutexLock lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

int64_t HeldKvStore::bytes() const {
  MutexLock lock(mu_);
  return bytes_;
}

}  // namespace afd::runtime

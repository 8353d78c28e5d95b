// The KV rows of finished prefill-leg requests (hold_kv_s > 0), staged in host memory for their
// consumer (prefill/decode disaggregation, docs/pd.md): the engine copies a request's rows out of
// the cache when it finishes -- freeing its blocks at once -- while the staged rows stay under
// a byte budget; transfers read them from any thread, without waiting for the engine's steps.
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "afd/common/thread_annotations.h"
#include "afd/runtime/request.h"

namespace afd::runtime {

class HeldKvStore {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HeldKvStore(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Whether rows of `bytes` fit the budget now (the rows whose deadline passed are dropped
  // first).
  bool Fits(int64_t bytes);
  // Stages request `id`'s rows until Erase or `deadline`.
  void Put(uint64_t id, std::shared_ptr<const KvRows> rows, Clock::time_point deadline);
  // The rows of `id`; null when none are staged (unknown, released or expired).
  std::shared_ptr<const KvRows> Find(uint64_t id);
  // Drops `id`'s rows; false when none were staged.
  bool Erase(uint64_t id);
  // Drops every entry whose deadline passed.
  void Expire();
  int64_t count() const;
  int64_t bytes() const;

 private:
  struct Entry {
    std::shared_ptr<const KvRows> rows;
    Clock::time_point deadline;
  };
  void ExpireLocked(Clock::time_point now) AFD_REQUIRES(mu_);
  const int64_t max_bytes_;
  mutable Mutex mu_;
  std::map<uint64_t, Entry> entries_ AFD_GUARDED_BY(mu_);
  int64_t bytes_ AFD_GUARDED_BY(mu_) = 0;
};

}  // namespace afd::runtime

// Clang's thread-safety annotations (-Wthread-safety; no-ops under other compilers) and a mutex
// and scoped lock that carry them, so that "guarded by mu_" is checked rather than written as
// prose. The check: the `thread_safety_analysis` test compiles every source that uses them with
// clang and -Werror=thread-safety (tools/check_thread_safety.py).
//
// Use: `Mutex mu_; int n_ AFD_GUARDED_BY(mu_);`, `MutexLock lock(mu_);` in a scope, a private
// helper called with the lock held `void Step() AFD_REQUIRES(mu_);`, and
// std::condition_variable_any for waits (`cv_.wait(lock, ...)` takes the MutexLock).
#pragma once

#include <mutex>

#if defined(__clang__)
#define AFD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define AFD_THREAD_ANNOTATION(x)
#endif

#define AFD_CAPABILITY(x) AFD_THREAD_ANNOTATION(capability(x))
#define AFD_SCOPED_CAPABILITY AFD_THREAD_ANNOTATION(scoped_lockable)
#define AFD_GUARDED_BY(x) AFD_THREAD_ANNOTATION(guarded_by(x))
#define AFD_PT_GUARDED_BY(x) AFD_THREAD_ANNOTATION(pt_guarded_by(x))
#define AFD_REQUIRES(...) AFD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define AFD_EXCLUDES(...) AFD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define AFD_ACQUIRE(...) AFD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define AFD_RELEASE(...) AFD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define AFD_NO_THREAD_SAFETY_ANALYSIS AFD_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace afd {

// std::mutex with the annotations (Lockable: std::condition_variable_any and std::lock_guard
// work with it too, though only MutexLock is understood by the analysis).
class AFD_CAPABILITY("mutex") Mutex {
 public:
  void lock() AFD_ACQUIRE() { mu_.lock(); }
  void unlock() AFD_RELEASE() { mu_.unlock(); }
  bool try_lock() AFD_THREAD_ANNOTATION(try_acquire_capability(true)) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` for its scope; unlock() / lock() in between (what a condition variable's wait does
// through it) keep the analysis in step.
class AFD_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) AFD_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() AFD_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  void lock() AFD_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }
  void unlock() AFD_RELEASE() {
    held_ = false;
    mu_.unlock();
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

}  // namespace afd

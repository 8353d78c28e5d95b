// Tasks run in order of arrival on a fixed set of threads, with a bound on those waiting: what a
// component needs to take slow work (a transfer, a large send) off the thread that found it.
// Thread safety: every method may be called from any thread; tasks catch their own errors.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "afd/common/thread_annotations.h"

namespace afd {

class WorkQueue {
 public:
  WorkQueue(int threads, size_t max_queued);
  ~WorkQueue();  // Stop()
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;
  // Queues `task`; false when max_queued tasks wait already or the queue stopped.
  bool Post(std::function<void()> task);
  // Takes no more tasks, runs those queued, joins the threads.
  void Stop();

 private:
  void Run();
  const size_t max_queued_;
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> queue_ AFD_GUARDED_BY(mu_);
  bool stop_ AFD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace afd

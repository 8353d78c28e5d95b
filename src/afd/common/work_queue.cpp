#include "afd/common/work_queue.h"

#include "afd/common/error.h"

namespace afd {

WorkQueue::WorkQueue(int threads, size_t max_queued) : max_queued_(max_queued) {
  AFD_CHECK(threads >= 1, "a work queue needs a thread, got {}", threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkQueue::~WorkQueue() { Stop(); }

bool WorkQueue::Post(std::function<void()> task) {
  {
    MutexLock lock(mu_);
    if (stop_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkQueue::Stop() {
  {
    MutexLock lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void WorkQueue::Run() {
  MutexLock lock(mu_);
  while (true) {
    while (!stop_ && queue_.empty()) cv_.wait(lock);
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace afd

// WorkQueue: tasks run in order on one thread (and all of them on several), a full queue
// refuses more, and Stop runs what is queued, then refuses.
#include "afd/common/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <vector>

namespace afd {
namespace {

TEST(WorkQueue, RunsInOrderBoundsTheWaitingAndDrainsOnStop) {
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  std::mutex mu;
  std::vector<int> ran;
  WorkQueue q(1, 2);
  ASSERT_TRUE(q.Post([go] { go.wait(); }));  // holds the one thread
  for (int i = 0; i < 200; ++i) {
    if (q.Post([&, i] {
          std::lock_guard<std::mutex> lock(mu);
          ran.push_back(i);
        })) {
      continue;
    }
    break;  // full: at most 2 wait
  }
  release.set_value();
  q.Stop();
  EXPECT_FALSE(q.Post([] {}));  // stopped
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(ran.empty());
  // At most 2 waited (fewer while the blocking task itself still waited), and none was lost.
  EXPECT_LE(ran.size(), 2u);
  for (size_t i = 0; i < ran.size(); ++i) EXPECT_EQ(ran[i], static_cast<int>(i));
}

TEST(WorkQueue, EveryTaskRunsOnSeveralThreads) {
  std::atomic<int> done{0};
  {
    WorkQueue q(4, 1000);
    for (int i = 0; i < 500; ++i) ASSERT_TRUE(q.Post([&] { ++done; }));
  }  // the destructor stops: runs what is queued, joins
  EXPECT_EQ(done.load(), 500);
}

}  // namespace
}  // namespace afd

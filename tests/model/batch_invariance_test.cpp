// Bitwise determinism of the forward pass: a sequence's logits do not depend on what else is in
// the batch, nor on whether its positions came through prefill or decode steps. The AFD runs are
// compared to the monolithic run on this property.
#include <gtest/gtest.h>

#include <cstring>

#include "afd/common/error.h"
#include "afd/model/loader.h"

namespace afd::model {
namespace {

class BatchInvarianceTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = OpenModel("preset:tiny", OpenOptions{}); }

  std::vector<float> Run(MlaKvCache& cache, const ForwardBatch& batch) {
    LocalMoeBackend moe(model_->config(), model_->weights());
    std::vector<float> logits(batch.size() * model_->config().vocab_size);
    model_->Forward(batch, cache, moe, logits.data());
    return logits;
  }
  std::unique_ptr<DeepseekModel> model_;
};

TEST_F(BatchInvarianceTest, BatchedEqualsAlone) {
  const int64_t v = model_->config().vocab_size;
  const std::vector<int32_t> a = {5, 9, 300, 1000, 42, 17, 17}, b = {8, 7, 6};
  MlaKvCache alone = model_->NewCache();
  ForwardBatch ba, bb;
  ba.Add(alone.AddSequence(16), a, 0);
  bb.Add(alone.AddSequence(16), b, 0);
  const std::vector<float> la = Run(alone, ba), lb = Run(alone, bb);

  MlaKvCache together = model_->NewCache();
  ForwardBatch both;
  const int sb = together.AddSequence(16), sa = together.AddSequence(16);
  both.Add(sb, b, 0);
  both.Add(sa, a, 0);
  const std::vector<float> l = Run(together, both);
  EXPECT_EQ(0, std::memcmp(l.data(), lb.data(), lb.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(l.data() + b.size() * v, la.data(), la.size() * sizeof(float)));
}

TEST_F(BatchInvarianceTest, DecodeEqualsPrefill) {
  const int64_t v = model_->config().vocab_size;
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  MlaKvCache full_cache = model_->NewCache();
  ForwardBatch full;
  full.Add(full_cache.AddSequence(ids.size()), ids, 0);
  const std::vector<float> ref = Run(full_cache, full);

  MlaKvCache cache = model_->NewCache();
  const int slot = cache.AddSequence(ids.size());
  ForwardBatch first;
  first.Add(slot, {ids.begin(), ids.begin() + 4}, 0);
  std::vector<float> got = Run(cache, first);
  for (size_t i = 4; i < ids.size(); ++i) {
    ForwardBatch step;
    step.Add(slot, {ids[i]}, i);
    const std::vector<float> l = Run(cache, step);
    got.insert(got.end(), l.begin(), l.end());
  }
  ASSERT_EQ(got.size(), ids.size() * v);
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)));
}

TEST_F(BatchInvarianceTest, RejectsBatchesThatDoNotContinueTheCache) {
  MlaKvCache cache = model_->NewCache();
  const int slot = cache.AddSequence(4);
  ForwardBatch gap;
  gap.Add(slot, {1, 2}, 1);  // must start at 0
  EXPECT_THROW(Run(cache, gap), Error);
  ForwardBatch too_long;
  too_long.Add(slot, {1, 2, 3, 4, 5}, 0);  // capacity 4
  EXPECT_THROW(Run(cache, too_long), Error);
  ForwardBatch bad_id;
  bad_id.Add(slot, {1024}, 0);  // vocab 1024
  EXPECT_THROW(Run(cache, bad_id), Error);
}

}  // namespace
}  // namespace afd::model

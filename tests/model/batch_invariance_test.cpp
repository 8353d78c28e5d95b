// Bitwise determinism of the forward pass: a sequence's logits do not depend on what else is in
// the batch, nor on whether its positions came through prefill or decode steps, nor on where its
// cache blocks are. The AFD runs are compared to the monolithic run on this property.
#include <gtest/gtest.h>

#include <cstring>

#include "afd/common/error.h"
#include "testing/model_harness.h"

namespace afd::model {
namespace {

using testing_util::ModelHarness;

// Both attention kinds: DeepSeek's MLA (preset:tiny) and Qwen3's GQA (preset:tiny-qwen3).
class BatchInvarianceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvarianceTest, BatchedEqualsAlone) {
  ModelHarness alone(GetParam()), together(GetParam());
  const int64_t v = alone.vocab();
  const std::vector<int32_t> a = {5, 9, 300, 1000, 42, 17, 17}, b = {8, 7, 6};
  ForwardBatch ba, bb;
  alone.Add(ba, alone.NewSequence(16), a, 0);
  alone.Add(bb, alone.NewSequence(16), b, 0);
  const std::vector<float> la = alone.Run(ba), lb = alone.Run(bb);

  // Other blocks (sequences interleaved in the pool), other batch order.
  ForwardBatch both;
  const int64_t sb = together.NewSequence(3), sa = together.NewSequence(16);
  together.Add(both, sb, b, 0);
  together.Add(both, sa, a, 0);
  const std::vector<float> l = together.Run(both);
  EXPECT_EQ(0, std::memcmp(l.data(), lb.data(), lb.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(l.data() + b.size() * v, la.data(), la.size() * sizeof(float)));
}

TEST_P(BatchInvarianceTest, DecodeEqualsPrefill) {
  ModelHarness h(GetParam());
  const int64_t v = h.vocab();
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  ForwardBatch full;
  h.Add(full, h.NewSequence(ids.size()), ids, 0);
  const std::vector<float> ref = h.Run(full);

  const int64_t seq = h.NewSequence(ids.size());
  ForwardBatch first;
  h.Add(first, seq, {ids.begin(), ids.begin() + 4}, 0);
  std::vector<float> got = h.Run(first);
  for (size_t i = 4; i < ids.size(); ++i) {
    ForwardBatch step;
    h.Add(step, seq, {ids[i]}, i);
    const std::vector<float> l = h.Run(step);
    got.insert(got.end(), l.begin(), l.end());
  }
  ASSERT_EQ(got.size(), ids.size() * v);
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)));
}

TEST_P(BatchInvarianceTest, OnlyTheAskedLogitsRowsAreComputedAndEqual) {
  ModelHarness h(GetParam());
  const int64_t v = h.vocab();
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5};
  ForwardBatch all;
  h.Add(all, h.NewSequence(ids.size()), ids, 0);
  const std::vector<float> ref = h.Run(all);
  ForwardBatch last;
  last.Add(h.cache(), h.NewSequence(ids.size()), ids, 0, ForwardBatch::Logits::kLast);
  const std::vector<float> got = h.Run(last);
  ASSERT_EQ(got.size(), static_cast<size_t>(v));
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data() + 4 * v, v * sizeof(float)));
}

TEST_P(BatchInvarianceTest, RejectsBatchesThatDoNotContinueTheCache) {
  ModelHarness h(GetParam());
  const int64_t seq = h.NewSequence(4);
  ForwardBatch gap;
  h.Add(gap, seq, {1, 2}, 1);  // must start at 0
  EXPECT_THROW(h.Run(gap), Error);
  ForwardBatch too_long;
  EXPECT_THROW(h.Add(too_long, seq, {1, 2, 3, 4, 5}, 0), Error);  // 4 reserved positions
  ForwardBatch bad_id;
  h.Add(bad_id, seq, {1024}, 0);  // vocab 1024
  EXPECT_THROW(h.Run(bad_id), Error);
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvarianceTest,
                         ::testing::Values("preset:tiny", "preset:tiny-qwen3"),
                         [](const auto& info) {
                           return info.param == "preset:tiny" ? std::string("mla")
                                                              : std::string("gqa");
                         });

}  // namespace
}  // namespace afd::model

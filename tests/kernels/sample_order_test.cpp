// The CPU sampler's candidate order: the radix sort (top_k 0 and large k) and the partial sort
// (small k) give the same total order -- decreasing logit, NaN last, -0 == +0, ties by lower id
// -- so which one runs never changes a sampled id.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "afd/kernels/cpu/sample.h"

namespace afd::kernels::cpu {
namespace {

std::vector<float> AwkwardRow(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> row(vocab);
  for (auto& v : row) v = normal(rng);
  // Ties, signed zeros, infinities, NaN, denormals and huge magnitudes.
  for (int64_t i = 0; i < vocab; i += 7) row[i] = row[(i * 31) % vocab];
  row[3] = -0.0f;
  row[5] = 0.0f;
  row[8] = -0.0f;
  row[11] = std::numeric_limits<float>::infinity();
  row[13] = -std::numeric_limits<float>::infinity();
  row[17] = std::numeric_limits<float>::quiet_NaN();
  row[19] = -std::numeric_limits<float>::infinity();
  row[23] = std::numeric_limits<float>::denorm_min();
  row[29] = -std::numeric_limits<float>::denorm_min();
  row[31] = 3.0e38f;
  row[37] = -3.0e38f;
  row[41] = std::numeric_limits<float>::quiet_NaN();
  return row;
}

TEST(SampleOrder, RadixAndComparisonSortsAgree) {
  for (const int64_t vocab : {64, 1000, 4099, 131072}) {
    const std::vector<float> row = AwkwardRow(vocab, static_cast<uint64_t>(vocab));
    for (const int64_t k : {int64_t{1}, int64_t{50}, vocab / 2, vocab}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " k " + std::to_string(k));
      EXPECT_EQ(SamplingOrderByRadix(row.data(), vocab, k),
                SamplingOrderByComparison(row.data(), vocab, k));
    }
  }
}

TEST(SampleOrder, TopKZeroSamplesAsTheWholeVocabularyInOrder) {
  const int64_t vocab = 20000;
  const std::vector<float> row = AwkwardRow(vocab, 7);
  for (int draw = 0; draw < 50; ++draw) {
    SampleRow all{0.8f, 0, 0.9f, (draw + 0.5) / 50.0};
    SampleRow every{0.8f, vocab, 0.9f, (draw + 0.5) / 50.0};  // the same, by top_k = vocab
    const int32_t id = SampleRowIds(row.data(), vocab, all);
    EXPECT_EQ(id, SampleRowIds(row.data(), vocab, every));
    EXPECT_FALSE(std::isnan(row[id]));
  }
}

}  // namespace
}  // namespace afd::kernels::cpu

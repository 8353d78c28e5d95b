// What the P2P attention ranks decide together for a step (DecideP2pStep): whether it replays
// graphs (FULL_DECODE_ONLY: every rank with tokens has a graph size; the largest is used) and
// how many micro-batches it runs. The exchanged vector is [A counts, A active, A DBO wishes,
// A graph sizes]. And which FFN graph a step's metadata may be served from (FfnGraphKeyOf).
#include <gtest/gtest.h>

#include <vector>

#include "afd/common/error.h"
#include "afd/roles/p2p_attention.h"
#include "afd/roles/p2p_ffn_worker.h"

namespace afd::roles {
namespace {

std::vector<int64_t> Exchanged(const std::vector<int64_t>& counts,
                               const std::vector<int64_t>& dbo_wishes,
                               const std::vector<int64_t>& graph_sizes) {
  std::vector<int64_t> v = counts;
  for (int64_t n : counts) v.push_back(n > 0 ? 1 : 0);
  v.insert(v.end(), dbo_wishes.begin(), dbo_wishes.end());
  v.insert(v.end(), graph_sizes.begin(), graph_sizes.end());
  return v;
}

TEST(DecideP2pStep, EveryRankWithTokensReplaysTheLargestGraphSize) {
  const DboOptions off;
  const ReplicaStep s = DecideP2pStep(Exchanged({3, 7, 1}, {0, 0, 0}, {4, 8, 1}), 3, off);
  EXPECT_EQ(s.graph_bucket, 8);
  EXPECT_EQ(s.stages, 1);
}

TEST(DecideP2pStep, RanksWithoutTokensDoNotObject) {
  const DboOptions off;
  EXPECT_EQ(DecideP2pStep(Exchanged({0, 5}, {0, 0}, {0, 8}), 2, off).graph_bucket, 8);
  // No rank has tokens: nothing to replay.
  EXPECT_EQ(DecideP2pStep(Exchanged({0, 0}, {0, 0}, {0, 0}), 2, off).graph_bucket, 0);
}

TEST(DecideP2pStep, OneEagerRankMakesTheWholeStepEager) {
  // Rank 1 has a prefill (or a batch above the largest size): no graph size.
  const DboOptions off;
  const ReplicaStep s = DecideP2pStep(Exchanged({4, 9}, {0, 0}, {4, 0}), 2, off);
  EXPECT_EQ(s.graph_bucket, 0);
  EXPECT_EQ(s.stages, 1);
}

TEST(DecideP2pStep, GraphStepsTakeTheirMicroBatchesFromTheGraphSize) {
  DboOptions dbo;
  dbo.enabled = true;
  dbo.decode_token_threshold = 8;
  // Rank 0's 3 tokens want no micro-batches alone, but the step replays size 16: two stages on
  // every rank (the idle rank's zero rows too), whatever the wishes say.
  EXPECT_EQ(DecideP2pStep(Exchanged({3, 12, 0}, {0, 1, 0}, {4, 16, 0}), 3, dbo).stages, 2);
  EXPECT_EQ(DecideP2pStep(Exchanged({3, 5}, {1, 1}, {4, 8}), 2, dbo).stages, 2);
  EXPECT_EQ(DecideP2pStep(Exchanged({3, 5}, {1, 1}, {4, 4}), 2, dbo).stages, 1);
  // Eager steps: two stages only when every rank with tokens wants them.
  EXPECT_EQ(DecideP2pStep(Exchanged({30, 40}, {1, 1}, {0, 0}), 2, dbo).stages, 2);
  EXPECT_EQ(DecideP2pStep(Exchanged({30, 40}, {1, 0}, {0, 0}), 2, dbo).stages, 1);
  EXPECT_EQ(DecideP2pStep(Exchanged({0, 40}, {0, 1}, {0, 0}), 2, dbo).stages, 2);
  dbo.enabled = false;
  EXPECT_EQ(DecideP2pStep(Exchanged({3, 12}, {0, 0}, {4, 16}), 2, dbo).stages, 1);
}

// Seed 000 / afd-plugin #261, #270: a matching token count alone never replays an FFN graph.
TEST(DecideP2pStep, OnlyAFlaggedStepMapsToAnFfnGraph) {
  connector::StepMetadata decode;
  decode.num_stages = 1;
  decode.num_attention_ranks = 2;
  decode.token_counts = {8, 8};
  decode.flags = connector::kGraphReplay;
  connector::StepMetadata prefill = decode;  // the same counts, run eagerly by the attention
  prefill.flags = 0;
  EXPECT_FALSE(FfnGraphKeyOf(prefill).has_value());
  const std::optional<FfnGraphKey> key = FfnGraphKeyOf(decode);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(key->first, 1);
  EXPECT_EQ(key->second, decode.token_counts);
  // Another split of the same rows, or the same rows as two micro-batches: another graph.
  connector::StepMetadata other = decode;
  other.token_counts = {16, 0};
  EXPECT_NE(*FfnGraphKeyOf(other), *key);
  other = decode;
  other.num_stages = 2;
  other.token_counts = {4, 4, 4, 4};
  EXPECT_NE(*FfnGraphKeyOf(other), *key);
}

TEST(DecideP2pStep, RefusesAVectorOfTheWrongLength) {
  EXPECT_THROW(DecideP2pStep(std::vector<int64_t>(6, 0), 2, DboOptions{}), Error);
}

}  // namespace
}  // namespace afd::roles

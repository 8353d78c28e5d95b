// KV cache sizing of the serving engines: the override wins, the CPU budget is converted to
// blocks, never more than max_num_seqs full-length sequences use, and too little memory for
// one sequence is an error naming the flags.
#include "afd/deploy/kv_sizing.h"

#include <gtest/gtest.h>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"

namespace afd::deploy {
namespace {

TEST(KvSizing, CpuBudgetOverrideAndCap) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  const int64_t block_bytes = model->CacheShape(1).bytes();
  KvSizing s;
  s.max_model_len = 1000;  // 16 blocks of 64 per sequence (1001 positions)
  s.max_num_seqs = 1000;
  s.cpu_kv_cache_gib = 40.0 * block_bytes / 1073741824.0;
  EXPECT_EQ(ServingKvBlocks(*model, s), 40);
  s.max_num_seqs = 2;  // 2 x 16 blocks are all that can be used
  EXPECT_EQ(ServingKvBlocks(*model, s), 32);
  s.num_blocks_override = 5;
  EXPECT_EQ(ServingKvBlocks(*model, s), 5);
  s.num_blocks_override = 0;
  s.cpu_kv_cache_gib = 10.0 * block_bytes / 1073741824.0;  // less than one sequence
  try {
    ServingKvBlocks(*model, s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-model-len 1000"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--cpu-kv-cache-gib"), std::string::npos) << e.what();
  }
  EXPECT_NE(DescribeKvBlocks(*model, 5).find("5 blocks of 64 tokens (320 tokens"),
            std::string::npos);
}

}  // namespace
}  // namespace afd::deploy

// `--kv-transfer-config` (vLLM's flag): the fields this runtime reads, and every bad input
// refused naming its field.
#include "afd/config/kv_transfer_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "afd/common/error.h"

namespace afd {
namespace {

TEST(KvTransferConfig, ReadsTheFields) {
  const KvTransferConfig c = ParseKvTransferConfig(
      R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_producer", "kv_ip": "10.0.0.2",
          "kv_port": 15000, "engine_id": "p0",
          "kv_connector_extra_config": {"hold_timeout_s": 30, "transfer_timeout_s": 5,
                                        "transport": "cuda_ipc"}})");
  EXPECT_EQ(c.role, KvTransferConfig::Role::kProducer);
  EXPECT_TRUE(c.produces());
  EXPECT_FALSE(c.consumes());
  EXPECT_EQ(c.kv_ip, "10.0.0.2");
  EXPECT_EQ(c.kv_port, 15000);
  EXPECT_EQ(c.engine_id, "p0");
  EXPECT_EQ(c.hold_timeout_s, 30);
  EXPECT_EQ(c.transfer_timeout_s, 5);
  EXPECT_EQ(c.transport, KvTransferConfig::Transport::kCudaIpc);
  const KvTransferConfig d =
      ParseKvTransferConfig(R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both"})");
  EXPECT_TRUE(d.produces() && d.consumes());
  EXPECT_EQ(d.kv_port, 14579);
  EXPECT_EQ(d.hold_timeout_s, 480);
  EXPECT_EQ(d.transport, KvTransferConfig::Transport::kTcp);
  EXPECT_EQ(d.load_failure_policy, KvTransferConfig::LoadFailurePolicy::kFail);  // vLLM's default
  EXPECT_TRUE(d.ignored.empty());
}

// vLLM's keys common in recipes: kv_load_failure_policy is read; the others are checked for
// their type and listed as ignored (the server warns), never fatal; null is vLLM's None.
TEST(KvTransferConfig, VllmRecipeKeysAreAcceptedAndTheMeaninglessOnesListed) {
  const KvTransferConfig c = ParseKvTransferConfig(
      R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_consumer", "kv_buffer_device": "cuda",
          "kv_buffer_size": 5e9, "kv_rank": 1, "kv_parallel_size": 2,
          "kv_load_failure_policy": "recompute", "enable_permute_local_kv": false,
          "engine_id": null})");
  EXPECT_EQ(c.load_failure_policy, KvTransferConfig::LoadFailurePolicy::kRecompute);
  ASSERT_EQ(c.ignored.size(), 5u);
  for (const char* key : {"kv_buffer_device", "kv_buffer_size", "kv_rank", "kv_parallel_size",
                          "enable_permute_local_kv"}) {
    const std::string head = std::string("kv_transfer_config.") + key + " (";
    EXPECT_EQ(std::count_if(c.ignored.begin(), c.ignored.end(),
                            [&](const std::string& s) { return s.rfind(head, 0) == 0; }),
              1)
        << key;
  }
  EXPECT_EQ(c.engine_id, "");
}

TEST(KvTransferConfig, BadInputIsRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"kv_connector": "NixlConnector", "kv_role": "kv_both"})", "kv_connector"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_decoder"})", "kv_role"},
      {R"({"kv_connector": "AfdKvConnector"})", "kv_role is required"},
      {R"({"kv_role": "kv_both"})", "kv_connector is required"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both", "kv_port": 70000})", "kv_port"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both", "kv_buffer_slots": 1})",
       "kv_buffer_slots: unknown field"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both", "kv_buffer_size": "big"})",
       "kv_buffer_size"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both", "kv_rank": -1})", "kv_rank"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both",
           "kv_load_failure_policy": "retry"})",
       "kv_load_failure_policy: 'retry' (recompute or fail)"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both",
           "kv_connector_module_path": "my.module"})",
       "kv_connector_module_path: a Python connector module cannot be loaded"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"hold_s": 1}})",
       "kv_connector_extra_config.hold_s: unknown field"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"transport": "nixl"}})",
       "kv_connector_extra_config.transport: 'nixl' (tcp or cuda_ipc)"},
      {R"([1])", "must be a JSON object"},
      {R"({"kv_connector": "AfdKvConnector", "kv_role": "kv_both", "kv_ip": "0.0.0.0"})",
       "the address consumers reach"},
  };
  for (const auto& [text, says] : cases) {
    try {
      ParseKvTransferConfig(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace afd

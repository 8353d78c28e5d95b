#include "afd/config/afd_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "afd/common/error.h"

namespace afd {
namespace {

using nlohmann::json;

// Expects ParseAfdConfig(text) to throw an afd::Error whose message contains every fragment.
void ExpectInvalid(const std::string& text, std::initializer_list<std::string> fragments) {
  try {
    ParseAfdConfig(text);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const Error& e) {
    for (const auto& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << f << "\" for " << text;
    }
  }
}

TEST(AfdConfig, DefaultsOfEmptyObject) {
  const AfdConfig c = ParseAfdConfig("{}");
  EXPECT_EQ(c.role, Role::kAttention);
  EXPECT_EQ(c.connector, "P2pNcclAFDConnector");
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, 1239);
  EXPECT_EQ(c.num_attention_ranks, 1);
  EXPECT_EQ(c.num_ffn_ranks, 1);
  EXPECT_FALSE(c.compute_gate_on_attention);
  EXPECT_EQ(c.afd_process_group_timeout_s, 120);
  EXPECT_FALSE(c.async_dp);
}

TEST(AfdConfig, Seed000ExampleWholeAndBare) {
  const std::string bare = R"({"role": "ffn", "connector": "P2pNcclAFDConnector",
    "host": "10.0.0.7", "port": 6239, "num_attention_ranks": 3, "num_ffn_ranks": 5,
    "compute_gate_on_attention": true, "afd_process_group_timeout_s": 30,
    "connector_extra_config": {}})";
  for (const std::string& text : {bare, R"({"other_plugin": {"x": 1}, "afd": )" + bare + "}"}) {
    const AfdConfig c = ParseAfdConfig(text);
    EXPECT_EQ(c.role, Role::kFfn);
    EXPECT_EQ(c.host, "10.0.0.7");
    EXPECT_EQ(c.port, 6239);
    EXPECT_EQ(c.num_attention_ranks, 3);
    EXPECT_EQ(c.num_ffn_ranks, 5);  // A < F is allowed
    EXPECT_TRUE(c.compute_gate_on_attention);
    EXPECT_EQ(c.afd_process_group_timeout_s, 30);
  }
}

TEST(AfdConfig, NormalizedJsonHasCanonicalNamesAndDefaults) {
  const AfdConfig c = ParseAfdConfig(R"({"afd_role": "ffn", "afd_port": 7000, "async": false})");
  const json out = json::parse(AfdConfigToJson(c));
  EXPECT_EQ(out, json::parse(R"({"role": "ffn", "connector": "P2pNcclAFDConnector",
    "host": "127.0.0.1", "port": 7000, "num_attention_ranks": 1, "num_ffn_ranks": 1,
    "compute_gate_on_attention": false, "afd_process_group_timeout_s": 120, "async_dp": false,
    "connector_extra_config": {}})"));
  // Round trip: the normalized output parses to the same config.
  EXPECT_EQ(AfdConfigToJson(ParseAfdConfig(AfdConfigToJson(c))), AfdConfigToJson(c));
}

TEST(AfdConfig, Aliases) {
  const AfdConfig c = ParseAfdConfig(
      R"({"afd_role": "ffn", "afd_connector": "P2pHostAFDConnector", "afd_host": "h1",
          "afd_port": 4000})");
  EXPECT_EQ(c.role, Role::kFfn);
  EXPECT_EQ(c.connector, "P2pHostAFDConnector");
  EXPECT_EQ(c.host, "h1");
  EXPECT_EQ(c.port, 4000);
  // Both spellings with the same value are fine; different values are an error.
  EXPECT_EQ(ParseAfdConfig(R"({"port": 4000, "afd_port": 4000})").port, 4000);
  ExpectInvalid(R"({"port": 4000, "afd_port": 4001})", {"afd.port", "afd_port", "4000", "4001"});
  ExpectInvalid(R"({"afd_role": "ffn", "role": "attention"})", {"afd.role", "different values"});
  ExpectInvalid(R"({"host": "a", "afd_host": "b"})", {"afd.host"});
  ExpectInvalid(R"({"connector": "P2pNcclAFDConnector", "afd_connector": "P2pHostAFDConnector"})",
                {"afd.connector"});
  ExpectInvalid(R"({"async": true, "async_dp": false})", {"afd.async_dp"});
}

TEST(AfdConfig, BadValuesOfEveryField) {
  ExpectInvalid(R"({"role": "decoder"})", {"afd.role", "decoder", "attention", "ffn"});
  ExpectInvalid(R"({"role": 1})", {"afd.role", "must be a string"});
  ExpectInvalid(R"({"connector": "NopeConnector"})", {"afd.connector", "NopeConnector"});
  ExpectInvalid(R"({"connector": null})", {"afd.connector", "must be a string", "null"});
  ExpectInvalid(R"({"host": ""})", {"afd.host", "non-empty"});
  ExpectInvalid(R"({"host": "a b"})", {"afd.host", "a b"});
  ExpectInvalid(R"({"host": 127})", {"afd.host", "must be a string"});
  ExpectInvalid(R"({"port": 0})", {"afd.port", "0", "1..65535"});
  ExpectInvalid(R"({"port": 65536})", {"afd.port", "65536", "1..65535"});
  ExpectInvalid(R"({"port": -5})", {"afd.port", "-5"});
  ExpectInvalid(R"({"port": 18446744073709551615})", {"afd.port", "out of range"});
  ExpectInvalid(R"({"num_attention_ranks": 0})", {"afd.num_attention_ranks", "0"});
  ExpectInvalid(R"({"num_ffn_ranks": -1})", {"afd.num_ffn_ranks", "-1"});
  ExpectInvalid(R"({"num_ffn_ranks": 99999999})", {"afd.num_ffn_ranks", "99999999"});
  ExpectInvalid(R"({"compute_gate_on_attention": "yes"})",
                {"afd.compute_gate_on_attention", "true or false"});
  ExpectInvalid(R"({"compute_gate_on_attention": 1})", {"afd.compute_gate_on_attention"});
  ExpectInvalid(R"({"afd_process_group_timeout_s": 0})", {"afd.afd_process_group_timeout_s"});
  ExpectInvalid(R"({"afd_process_group_timeout_s": 100000})",
                {"afd.afd_process_group_timeout_s", "100000"});
  ExpectInvalid(R"({"connector_extra_config": []})", {"afd.connector_extra_config", "object"});
  ExpectInvalid(R"({"async_dp": "false"})", {"afd.async_dp", "true or false"});
}

TEST(AfdConfig, WrongJsonTypesAreNotCoerced) {
  ExpectInvalid(R"({"port": "6239"})", {"afd.port", "must be an integer", "string"});
  ExpectInvalid(R"({"port": 6239.0})", {"afd.port", "must be an integer", "number"});
  ExpectInvalid(R"({"port": true})", {"afd.port", "boolean"});
  ExpectInvalid(R"({"num_attention_ranks": 2.5})", {"afd.num_attention_ranks"});
  ExpectInvalid(R"({"afd": []})", {"afd", "must be an object"});
  ExpectInvalid(R"({"afd": null})", {"afd", "must be an object"});
  ExpectInvalid(R"([1, 2])", {"must be a JSON object"});
  ExpectInvalid(R"("afd")", {"must be a JSON object"});
}

TEST(AfdConfig, UnknownKeysAndRoleRank) {
  ExpectInvalid(R"({"prot": 1})", {"afd.prot", "unknown field"});
  ExpectInvalid(R"({"afd": {"num_atention_ranks": 2}})", {"afd.num_atention_ranks"});
  ExpectInvalid(R"({"afd_role_rank": 0})", {"afd.afd_role_rank", "derived"});
}

TEST(AfdConfig, NonJsonAndDuplicates) {
  ExpectInvalid("", {"not valid JSON"});
  ExpectInvalid("{role: ffn}", {"not valid JSON"});
  ExpectInvalid(R"({"port": 1)", {"not valid JSON"});
  ExpectInvalid(R"({"port": 1, "port": 2})", {"\"port\"", "more than once"});
  ExpectInvalid(R"({"afd": {"connector_extra_config": {"ring_depth": 1, "ring_depth": 2}}})",
                {"ring_depth", "more than once"});
}

TEST(AfdConfig, P2pConnectorRules) {
  for (const char* name : {"P2pNcclAFDConnector", "P2pHostAFDConnector"}) {
    const std::string base = std::string(R"({"connector": ")") + name + "\"";
    ExpectInvalid(base + R"(, "connector_extra_config": {"ring_depth": 1}})",
                  {"afd.connector_extra_config", "must be empty", name});
    ExpectInvalid(base + R"(, "async": true})", {"afd.async_dp", "must be false", name});
    ExpectInvalid(base + R"(, "async_dp": true})", {"afd.async_dp", "must be false"});
  }
  // A < F and non-divisible ratios are accepted.
  EXPECT_NO_THROW(ParseAfdConfig(R"({"num_attention_ranks": 1, "num_ffn_ranks": 4})"));
  EXPECT_NO_THROW(ParseAfdConfig(R"({"num_attention_ranks": 5, "num_ffn_ranks": 3})"));
}

constexpr const char* kAsyncBase =
    R"({"connector": "GpuAsyncAFDConnector", "async": true, "compute_gate_on_attention": true,
        "num_attention_ranks": 4, "num_ffn_ranks": 2, "connector_extra_config": )";

std::string Async(const std::string& extra) { return kAsyncBase + extra + "}"; }

TEST(AfdConfig, GpuAsyncDefaultsAndValues) {
  const AfdConfig d = ParseAfdConfig(Async("{}"));
  EXPECT_EQ(d.async_options.attn_ranks_per_dp, 1);
  EXPECT_EQ(d.async_options.ring_depth, 1);
  EXPECT_DOUBLE_EQ(d.async_options.routed_cap_multiplier, 2.0);
  EXPECT_FALSE(d.async_options.async_moe_ubatching);
  EXPECT_EQ(d.async_options.async_moe_num_ubatches, 2);
  EXPECT_EQ(d.async_options.async_moe_split, "request");
  EXPECT_TRUE(d.async_options.device_flags);
  EXPECT_EQ(d.async_options.window, "cuda_ipc");
  EXPECT_EQ(d.async_options.dispatch_dtype, "auto");
  EXPECT_TRUE(d.async_options.ffn_gather);
  EXPECT_EQ(d.async_options.ffn_gather_wait_us, 200);
  const json out = json::parse(AfdConfigToJson(d));
  EXPECT_EQ(out["connector_extra_config"]["ring_depth"], 1);
  EXPECT_EQ(out["connector_extra_config"]["device_flags"], true);
  EXPECT_EQ(out["connector_extra_config"]["window"], "cuda_ipc");
  EXPECT_EQ(out["connector_extra_config"]["dispatch_dtype"], "auto");
  EXPECT_EQ(out["connector_extra_config"]["ffn_gather"], true);
  EXPECT_EQ(out["connector_extra_config"]["ffn_gather_wait_us"], 200);
  EXPECT_EQ(out["async_dp"], true);

  const AfdConfig c = ParseAfdConfig(Async(
      R"({"attn_ranks_per_dp": 2, "routed_cap_multiplier": 3, "recv_poll_timeout_ms": 50,
          "async_moe_ubatching": true, "async_moe_num_ubatches": 3, "async_moe_split": "token",
          "device_flags": false, "window": "nccl", "dispatch_dtype": "fp8",
          "ffn_gather": false, "ffn_gather_wait_us": 0})"));
  EXPECT_EQ(c.async_options.attn_ranks_per_dp, 2);
  EXPECT_EQ(c.async_options.ring_depth, 3);  // derived: one slot per stage
  EXPECT_DOUBLE_EQ(c.async_options.routed_cap_multiplier, 3.0);
  EXPECT_EQ(c.async_options.recv_poll_timeout_ms, 50);
  EXPECT_EQ(c.async_options.async_moe_split, "token");
  EXPECT_FALSE(c.async_options.device_flags);
  EXPECT_EQ(c.async_options.window, "nccl");
  EXPECT_EQ(c.async_options.dispatch_dtype, "fp8");
  EXPECT_EQ(json::parse(AfdConfigToJson(c))["connector_extra_config"]["dispatch_dtype"], "fp8");
  EXPECT_FALSE(c.async_options.ffn_gather);
  EXPECT_EQ(c.async_options.ffn_gather_wait_us, 0);
}

TEST(AfdConfig, GpuAsyncImpliesAsyncDpAndGateOnAttention) {
  const AfdConfig c = ParseAfdConfig(R"({"connector": "GpuAsyncAFDConnector"})");
  EXPECT_TRUE(c.async_dp);
  EXPECT_TRUE(c.compute_gate_on_attention);
  const json out = json::parse(AfdConfigToJson(c));
  EXPECT_EQ(out["async_dp"], true);
  EXPECT_EQ(out["compute_gate_on_attention"], true);
  EXPECT_EQ(out["connector_extra_config"]["async_moe_split"], "request");
  // The P2P connectors keep the seed's defaults.
  EXPECT_FALSE(ParseAfdConfig(R"({"connector": "P2pNcclAFDConnector"})").async_dp);
}

TEST(AfdConfig, GpuAsyncBadOptions) {
  ExpectInvalid(Async(R"({"dynamicQuant": 1})"),
                {"connector_extra_config.dynamicQuant", "unknown"});
  ExpectInvalid(Async(R"({"attn_ranks_per_dp": 0})"), {"attn_ranks_per_dp"});
  ExpectInvalid(Async(R"({"attn_ranks_per_dp": 3})"), {"attn_ranks_per_dp", "must divide"});
  ExpectInvalid(Async(R"({"ring_depth": 0})"), {"ring_depth", "out of range", "1..64"});
  ExpectInvalid(Async(R"({"ring_depth": 65})"), {"ring_depth", "65"});
  ExpectInvalid(Async(R"({"ring_depth": 1, "async_moe_ubatching": true})"),
                {"ring_depth", "number of MoE stages"});
  ExpectInvalid(Async(R"({"routed_cap_multiplier": 0.5})"), {"routed_cap_multiplier"});
  ExpectInvalid(Async(R"({"routed_cap_multiplier": "2"})"), {"routed_cap_multiplier", "number"});
  ExpectInvalid(Async(R"({"recv_poll_timeout_ms": 0})"), {"recv_poll_timeout_ms"});
  ExpectInvalid(Async(R"({"async_moe_ubatching": 1})"), {"async_moe_ubatching"});
  ExpectInvalid(Async(R"({"async_moe_num_ubatches": 1})"), {"async_moe_num_ubatches"});
  ExpectInvalid(Async(R"({"async_moe_split": "layer"})"), {"async_moe_split", "layer"});
  ExpectInvalid(Async(R"({"device_flags": "yes"})"), {"device_flags"});
  ExpectInvalid(Async(R"({"window": "nvshmem"})"), {"window", "nvshmem", "cuda_ipc", "nccl"});
  ExpectInvalid(Async(R"({"window": 1})"), {"window"});
  ExpectInvalid(Async(R"({"dispatch_dtype": "fp4"})"),
                {"connector_extra_config.dispatch_dtype", "fp4", "auto", "fp8"});
  ExpectInvalid(Async(R"({"dispatch_dtype": 8})"), {"dispatch_dtype"});
  ExpectInvalid(Async(R"({"ffn_gather": "on"})"), {"connector_extra_config.ffn_gather"});
  ExpectInvalid(Async(R"({"ffn_gather_wait_us": -1})"), {"ffn_gather_wait_us", "1000000"});
  ExpectInvalid(Async(R"({"ffn_gather_wait_us": 1000001})"), {"ffn_gather_wait_us"});
  ExpectInvalid(R"({"connector": "GpuAsyncAFDConnector", "async": false})",
                {"afd.async_dp", "must be true"});
  ExpectInvalid(R"({"connector": "GpuAsyncAFDConnector", "compute_gate_on_attention": false})",
                {"afd.compute_gate_on_attention", "must be true"});
}

// --enable-dbo puts two micro-batches in flight: the asynchronous connectors' derived ring depth
// becomes 2; a ring_depth the user gave stays (the runner names a 1), P2P connectors are untouched.
TEST(AfdConfig, DboDerivesTwoRingSlotsUnlessGiven) {
  AfdConfig c = ParseAfdConfig(R"({"connector": "AsyncAFDConnector"})");
  DeriveConnectorOptions(false, 0, c);
  EXPECT_EQ(c.async_options.ring_depth, 1);
  DeriveConnectorOptions(true, 0, c);
  EXPECT_EQ(c.async_options.ring_depth, 2);
  AfdConfig ub = ParseAfdConfig(
      R"({"connector": "AsyncAFDConnector", "connector_extra_config":
          {"async_moe_ubatching": true, "async_moe_num_ubatches": 3}})");
  DeriveConnectorOptions(true, 0, ub);
  EXPECT_EQ(ub.async_options.ring_depth, 3);
  for (const int given : {1, 4}) {
    AfdConfig g = ParseAfdConfig(fmt::format(
        R"({{"connector": "AsyncAFDConnector", "connector_extra_config": {{"ring_depth": {}}}}})",
        given));
    DeriveConnectorOptions(true, 0, g);
    EXPECT_EQ(g.async_options.ring_depth, given);
  }
  AfdConfig p2p = ParseAfdConfig(R"({"connector": "P2pNcclAFDConnector"})");
  DeriveConnectorOptions(true, 2, p2p);
  EXPECT_EQ(AfdConfigToJson(p2p), AfdConfigToJson(ParseAfdConfig(R"({})")));
}

// An attention rank's tensor-parallel size is its replica's sender count, unless given.
TEST(AfdConfig, AttentionTpDerivesTheRanksPerReplicaUnlessGiven) {
  AfdConfig c = ParseAfdConfig(R"({"connector": "AsyncAFDConnector", "num_attention_ranks": 4})");
  DeriveConnectorOptions(false, 0, c);
  EXPECT_EQ(c.async_options.attn_ranks_per_dp, 1);
  DeriveConnectorOptions(false, 2, c);
  EXPECT_EQ(c.async_options.attn_ranks_per_dp, 2);
  AfdConfig g = ParseAfdConfig(
      R"({"connector": "AsyncAFDConnector", "num_attention_ranks": 4,
          "connector_extra_config": {"attn_ranks_per_dp": 4}})");
  DeriveConnectorOptions(false, 2, g);
  EXPECT_EQ(g.async_options.attn_ranks_per_dp, 4);  // the runner then names the difference
}

// AsyncAFDConnector (windows chosen by the device) has the same schema and rules as the seed's
// GpuAsyncAFDConnector.
TEST(AfdConfig, AsyncConnectorSharesTheSchema) {
  const AfdConfig c = ParseAfdConfig(R"({"connector": "AsyncAFDConnector"})");
  EXPECT_TRUE(c.is_async());
  EXPECT_FALSE(c.is_p2p());
  EXPECT_TRUE(c.async_dp);
  EXPECT_TRUE(c.compute_gate_on_attention);
  EXPECT_EQ(c.async_options.ring_depth, 1);
  const AfdConfig d = ParseAfdConfig(
      R"({"connector": "AsyncAFDConnector", "connector_extra_config": {"ring_depth": 2,
          "routed_cap_multiplier": 1.5, "recv_poll_timeout_ms": 20}})");
  EXPECT_EQ(d.async_options.ring_depth, 2);
  EXPECT_DOUBLE_EQ(d.async_options.routed_cap_multiplier, 1.5);
  EXPECT_EQ(d.async_options.recv_poll_timeout_ms, 20);
  ExpectInvalid(R"({"connector": "AsyncAFDConnector", "connector_extra_config": {"depth": 2}})",
                {"connector_extra_config.depth", "unknown option for AsyncAFDConnector"});
  ExpectInvalid(R"({"connector": "AsyncAFDConnector", "compute_gate_on_attention": false})",
                {"afd.compute_gate_on_attention", "must be true", "AsyncAFDConnector"});
  ExpectInvalid(R"({"connector": "AsyncAFDConnector", "async_dp": false})",
                {"afd.async_dp", "must be true"});
  ExpectInvalid(R"({"connector": "AsyncConnector"})", {"afd.connector", "AsyncAFDConnector"});
}

}  // namespace
}  // namespace afd

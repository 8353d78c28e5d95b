#include "afd/config/connector_options.h"

#include <set>
#include <string>

#include "afd/common/error.h"
#include "afd/config/json_fields.h"

namespace afd {

using nlohmann::json;
namespace jf = json_fields;

namespace {

constexpr std::string_view kExtraPath = "afd.connector_extra_config";

void ParseAsyncOptions(const json& extra, const std::string& connector, AsyncOptions& o) {
  static const std::set<std::string> kKeys = {
      "attn_ranks_per_dp",    "ring_depth",          "routed_cap_multiplier",
      "recv_poll_timeout_ms", "async_moe_ubatching", "async_moe_num_ubatches",
      "async_moe_split",      "device_flags",        "window",
      "dispatch_dtype",       "ffn_gather",          "ffn_gather_wait_us"};
  for (const auto& [key, value] : extra.items()) {
    AFD_CHECK(kKeys.count(key),
              "{}.{}: unknown option for {}; allowed: attn_ranks_per_dp, "
              "ring_depth, routed_cap_multiplier, recv_poll_timeout_ms, async_moe_ubatching, "
              "async_moe_num_ubatches, async_moe_split, device_flags, window, dispatch_dtype, "
              "ffn_gather, ffn_gather_wait_us",
              kExtraPath, key, connector);
  }
  auto path = [](std::string_view key) { return fmt::format("{}.{}", kExtraPath, key); };
  if (extra.contains("attn_ranks_per_dp")) {
    o.attn_ranks_per_dp = static_cast<int>(
        jf::GetInt(extra["attn_ranks_per_dp"], path("attn_ranks_per_dp"), 1, kMaxRanksPerRole));
    o.attn_ranks_per_dp_given = true;
  }
  if (extra.contains("routed_cap_multiplier")) {
    o.routed_cap_multiplier =
        jf::GetNumber(extra["routed_cap_multiplier"], path("routed_cap_multiplier"), 1.0, 1024.0);
  }
  if (extra.contains("recv_poll_timeout_ms")) {
    o.recv_poll_timeout_ms = static_cast<int>(
        jf::GetInt(extra["recv_poll_timeout_ms"], path("recv_poll_timeout_ms"), 1, 3600000));
  }
  if (extra.contains("async_moe_ubatching")) {
    o.async_moe_ubatching = jf::GetBool(extra["async_moe_ubatching"], path("async_moe_ubatching"));
  }
  if (extra.contains("async_moe_num_ubatches")) {
    o.async_moe_num_ubatches = static_cast<int>(
        jf::GetInt(extra["async_moe_num_ubatches"], path("async_moe_num_ubatches"), 2, 8));
  }
  if (extra.contains("async_moe_split")) {
    o.async_moe_split = jf::GetString(extra["async_moe_split"], path("async_moe_split"));
    AFD_CHECK(o.async_moe_split == "request" || o.async_moe_split == "token",
              "{}: value \"{}\" is not allowed; must be \"request\" or \"token\"",
              path("async_moe_split"), o.async_moe_split);
  }
  if (extra.contains("device_flags")) {
    o.device_flags = jf::GetBool(extra["device_flags"], path("device_flags"));
  }
  if (extra.contains("window")) {
    o.window = jf::GetString(extra["window"], path("window"));
    AFD_CHECK(o.window == "cuda_ipc" || o.window == "nccl",
              "{}: value \"{}\" is not allowed; must be \"cuda_ipc\" (CUDA IPC memory, one node, "
              "GPUs may be shared) or \"nccl\" (NCCL symmetric memory, one GPU per rank)",
              path("window"), o.window);
  }
  if (extra.contains("dispatch_dtype")) {
    o.dispatch_dtype = jf::GetString(extra["dispatch_dtype"], path("dispatch_dtype"));
    AFD_CHECK(o.dispatch_dtype == "auto" || o.dispatch_dtype == "fp8",
              "{}: value \"{}\" is not allowed; must be \"auto\" (the model's activation dtype: "
              "bf16 for a bf16 model on a GPU, else f32) or \"fp8\" (E4M3 rows with a float32 "
              "scale per 128 elements)",
              path("dispatch_dtype"), o.dispatch_dtype);
  }
  if (extra.contains("ffn_gather")) {
    o.ffn_gather = jf::GetBool(extra["ffn_gather"], path("ffn_gather"));
  }
  if (extra.contains("ffn_gather_wait_us")) {
    o.ffn_gather_wait_us = static_cast<int>(
        jf::GetInt(extra["ffn_gather_wait_us"], path("ffn_gather_wait_us"), 0, 1000000));
  }
  // ring_depth follows from an invariant: each (peer, stage) has at most one request in flight,
  // so the default is the number of stages and anything smaller would deadlock.
  o.ring_depth = o.num_stages();
  if (extra.contains("ring_depth")) {
    o.ring_depth = static_cast<int>(jf::GetInt(extra["ring_depth"], path("ring_depth"), 1, 64));
    o.ring_depth_given = true;
    AFD_CHECK(o.ring_depth >= o.num_stages(),
              "{}: value {} is smaller than the number of MoE stages ({}); each stage needs its "
              "own ring slot",
              path("ring_depth"), o.ring_depth, o.num_stages());
  }
}

}  // namespace

void CheckConnectorName(std::string_view name) {
  for (auto known : kConnectorNames) {
    if (name == known) return;
  }
  AFD_THROW(
      "afd.connector: unknown connector \"{}\"; must be one of P2pNcclAFDConnector, "
      "AsyncAFDConnector, GpuAsyncAFDConnector, P2pHostAFDConnector",
      name);
}

void ParseConnectorExtraConfig(const json& extra, AfdConfig& config) {
  if (config.is_async()) {
    config.async_options = AsyncOptions{};
    ParseAsyncOptions(extra, config.connector, config.async_options);
    return;
  }
  // Both P2P connectors have no options.
  AFD_CHECK(extra.empty(), "{}: must be empty for {}, which has no connector options; got {}",
            kExtraPath, config.connector, jf::Describe(extra));
}

nlohmann::ordered_json ConnectorExtraConfigToJson(const AfdConfig& config) {
  if (!config.is_async()) return nlohmann::ordered_json::object();
  const AsyncOptions& o = config.async_options;
  return nlohmann::ordered_json{{"attn_ranks_per_dp", o.attn_ranks_per_dp},
                                {"ring_depth", o.ring_depth},
                                {"routed_cap_multiplier", o.routed_cap_multiplier},
                                {"recv_poll_timeout_ms", o.recv_poll_timeout_ms},
                                {"async_moe_ubatching", o.async_moe_ubatching},
                                {"async_moe_num_ubatches", o.async_moe_num_ubatches},
                                {"async_moe_split", o.async_moe_split},
                                {"device_flags", o.device_flags},
                                {"window", o.window},
                                {"dispatch_dtype", o.dispatch_dtype},
                                {"ffn_gather", o.ffn_gather},
                                {"ffn_gather_wait_us", o.ffn_gather_wait_us}};
}

void ValidateConnectorRules(const AfdConfig& c) {
  CheckConnectorName(c.connector);
  if (c.is_p2p()) {
    AFD_CHECK(!c.async_dp,
              "afd.async_dp: must be false for {}; asynchronous AFD needs AsyncAFDConnector or "
              "GpuAsyncAFDConnector",
              c.connector);
    return;
  }
  // The asynchronous connectors: the attention side routes tokens before dispatch, and replicas run
  // without the DP-metadata control plane.
  AFD_CHECK(c.async_dp, "afd.async_dp: must be true for {} (it has no DP-metadata control plane)",
            c.connector);
  AFD_CHECK(c.compute_gate_on_attention,
            "afd.compute_gate_on_attention: must be true for {}, which dispatches tokens already "
            "routed by the attention side",
            c.connector);
  const AsyncOptions& o = c.async_options;
  AFD_CHECK(o.attn_ranks_per_dp <= c.num_attention_ranks &&
                c.num_attention_ranks % o.attn_ranks_per_dp == 0,
            "{}.attn_ranks_per_dp: value {} must divide num_attention_ranks ({})", kExtraPath,
            o.attn_ranks_per_dp, c.num_attention_ranks);
  AFD_CHECK(o.ring_depth >= o.num_stages() && o.ring_depth <= 64,
            "{}.ring_depth: value {} must be in {}..64 (at least the number of MoE stages)",
            kExtraPath, o.ring_depth, o.num_stages());
}

}  // namespace afd

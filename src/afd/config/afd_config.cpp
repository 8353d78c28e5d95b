#include "afd/config/afd_config.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <utility>

#include "afd/common/error.h"
#include "afd/config/connector_options.h"
#include "afd/config/json_fields.h"

namespace afd {

using nlohmann::json;
namespace jf = json_fields;

namespace {

// Canonical name and its compatibility alias.
constexpr std::array<std::pair<std::string_view, std::string_view>, 5> kAliases = {{
    {"role", "afd_role"},
    {"connector", "afd_connector"},
    {"host", "afd_host"},
    {"port", "afd_port"},
    {"async_dp", "async"},
}};

constexpr std::array<std::string_view, 10> kCanonicalKeys = {"role",
                                                             "connector",
                                                             "host",
                                                             "port",
                                                             "num_attention_ranks",
                                                             "num_ffn_ranks",
                                                             "compute_gate_on_attention",
                                                             "afd_process_group_timeout_s",
                                                             "async_dp",
                                                             "connector_extra_config"};

bool IsCanonical(std::string_view key) {
  return std::find(kCanonicalKeys.begin(), kCanonicalKeys.end(), key) != kCanonicalKeys.end();
}

// Folds aliases into canonical keys. Both spellings with different values is an error.
json Canonicalize(const json& afd) {
  json out = json::object();
  for (const auto& [key, value] : afd.items()) {
    std::string canonical = key;
    for (const auto& [name, alias] : kAliases) {
      if (key == alias) canonical = std::string(name);
    }
    if (canonical == key && !IsCanonical(key)) {
      AFD_CHECK(key != "afd_role_rank" && key != "role_rank",
                "afd.{}: the role rank is not configurable; it is derived from the process's "
                "DP/PCP/TP coordinates",
                key);
      AFD_THROW(
          "afd.{}: unknown field; allowed: role, connector, host, port, num_attention_ranks, "
          "num_ffn_ranks, compute_gate_on_attention, afd_process_group_timeout_s, async_dp, "
          "connector_extra_config (aliases afd_role, afd_connector, afd_host, afd_port, async)",
          key);
    }
    if (out.contains(canonical)) {
      // Only a canonical name and its alias can collide (JSON keys are unique).
      std::string_view alias;
      for (const auto& [name, a] : kAliases) {
        if (name == canonical) alias = a;
      }
      const json& canonical_value = key == canonical ? value : out[canonical];
      const json& alias_value = key == canonical ? out[canonical] : value;
      AFD_CHECK(canonical_value == alias_value,
                "afd.{0}: given as both \"{0}\" ({1}) and its alias \"{2}\" ({3}) with different "
                "values",
                canonical, jf::Describe(canonical_value), alias, jf::Describe(alias_value));
      continue;
    }
    out[canonical] = value;
  }
  return out;
}

AfdConfig FromCanonical(const json& a) {
  AfdConfig c;
  if (a.contains("role")) {
    const std::string role = jf::GetString(a["role"], "afd.role");
    AFD_CHECK(role == "attention" || role == "ffn",
              "afd.role: value \"{}\" is not allowed; must be \"attention\" or \"ffn\"", role);
    c.role = role == "attention" ? Role::kAttention : Role::kFfn;
  }
  if (a.contains("connector")) c.connector = jf::GetString(a["connector"], "afd.connector");
  if (a.contains("host")) {
    c.host = jf::GetString(a["host"], "afd.host");
    AFD_CHECK(!c.host.empty(), "afd.host: must be a non-empty host name or address");
    AFD_CHECK(c.host.size() <= 253 && c.host.find_first_of(" \t\r\n/") == std::string::npos,
              "afd.host: value \"{}\" is not a host name or address (no spaces or '/', at most "
              "253 characters)",
              c.host);
  }
  if (a.contains("port")) c.port = static_cast<int>(jf::GetInt(a["port"], "afd.port", 1, 65535));
  if (a.contains("num_attention_ranks")) {
    c.num_attention_ranks = static_cast<int>(
        jf::GetInt(a["num_attention_ranks"], "afd.num_attention_ranks", 1, kMaxRanksPerRole));
  }
  if (a.contains("num_ffn_ranks")) {
    c.num_ffn_ranks =
        static_cast<int>(jf::GetInt(a["num_ffn_ranks"], "afd.num_ffn_ranks", 1, kMaxRanksPerRole));
  }
  if (a.contains("compute_gate_on_attention")) {
    c.compute_gate_on_attention =
        jf::GetBool(a["compute_gate_on_attention"], "afd.compute_gate_on_attention");
  }
  if (a.contains("afd_process_group_timeout_s")) {
    c.afd_process_group_timeout_s = static_cast<int>(
        jf::GetInt(a["afd_process_group_timeout_s"], "afd.afd_process_group_timeout_s", 1, 86400));
  }
  if (a.contains("async_dp")) c.async_dp = jf::GetBool(a["async_dp"], "afd.async_dp");

  // The connector must be known before its extra config can be read.
  CheckConnectorName(c.connector);
  // The asynchronous connector implies async DP and routing on the attention side (its FFN side
  // receives tokens already routed): those are its defaults; an explicit false is rejected by
  // ValidateConnectorRules.
  if (c.is_async()) {
    if (!a.contains("async_dp")) c.async_dp = true;
    if (!a.contains("compute_gate_on_attention")) c.compute_gate_on_attention = true;
  }
  json extra = json::object();
  if (a.contains("connector_extra_config")) {
    extra = a["connector_extra_config"];
    AFD_CHECK(extra.is_object(), "afd.connector_extra_config: must be an object, got {}",
              jf::Describe(extra));
  }
  ParseConnectorExtraConfig(extra, c);
  return c;
}

}  // namespace

AfdConfig ParseAfdConfig(std::string_view json_text) {
  const json root = jf::ParseStrict(json_text, "AFD config");
  AFD_CHECK(root.is_object(), "AFD config: must be a JSON object, got {}", jf::Describe(root));
  const json* afd = &root;
  if (root.contains("afd")) {
    afd = &root["afd"];
    AFD_CHECK(afd->is_object(), "afd: must be an object, got {}", jf::Describe(*afd));
  }
  AfdConfig config = FromCanonical(Canonicalize(*afd));
  ValidateAfdConfig(config);
  return config;
}

void ValidateAfdConfig(const AfdConfig& c) {
  AFD_CHECK(c.port >= 1 && c.port <= 65535,
            "afd.port: value {} is out of range; must be in "
            "1..65535",
            c.port);
  AFD_CHECK(c.num_attention_ranks >= 1 && c.num_attention_ranks <= kMaxRanksPerRole,
            "afd.num_attention_ranks: value {} is out of range; must be in 1..{}",
            c.num_attention_ranks, kMaxRanksPerRole);
  AFD_CHECK(c.num_ffn_ranks >= 1 && c.num_ffn_ranks <= kMaxRanksPerRole,
            "afd.num_ffn_ranks: value {} is out of range; must be in 1..{}", c.num_ffn_ranks,
            kMaxRanksPerRole);
  AFD_CHECK(c.afd_process_group_timeout_s >= 1 && c.afd_process_group_timeout_s <= 86400,
            "afd.afd_process_group_timeout_s: value {} is out of range; must be in 1..86400",
            c.afd_process_group_timeout_s);
  AFD_CHECK(!c.host.empty(), "afd.host: must be a non-empty host name or address");
  ValidateConnectorRules(c);
}

void DeriveConnectorOptions(bool dbo_enabled, int attention_tp, AfdConfig& config) {
  if (!config.is_async()) return;
  AsyncOptions& o = config.async_options;
  if (dbo_enabled && !o.ring_depth_given) o.ring_depth = std::max(o.ring_depth, 2);
  if (attention_tp > 0 && !o.attn_ranks_per_dp_given) o.attn_ranks_per_dp = attention_tp;
}

std::string AfdConfigToJson(const AfdConfig& c, int indent) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  out["role"] = std::string(RoleName(c.role));
  out["connector"] = c.connector;
  out["host"] = c.host;
  out["port"] = c.port;
  out["num_attention_ranks"] = c.num_attention_ranks;
  out["num_ffn_ranks"] = c.num_ffn_ranks;
  out["compute_gate_on_attention"] = c.compute_gate_on_attention;
  out["afd_process_group_timeout_s"] = c.afd_process_group_timeout_s;
  out["async_dp"] = c.async_dp;
  out["connector_extra_config"] = ConnectorExtraConfigToJson(c);
  return out.dump(indent);
}

}  // namespace afd

// Per-connector rules: each connector owns a closed schema for connector_extra_config and its
// own constraints on the common fields. Internal to the config layer (uses JSON).
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <string_view>

#include "afd/config/afd_config.h"

namespace afd {

inline constexpr std::array<std::string_view, 4> kConnectorNames = {
    kP2pNcclConnector, kAsyncConnector, kGpuAsyncConnector, kP2pHostConnector};

// Throws afd::Error naming afd.connector unless `name` is one of kConnectorNames.
void CheckConnectorName(std::string_view name);

// Parses `extra` (already known to be an object) into config.async_options according to
// config.connector, which must already be a known connector name. Throws afd::Error.
void ParseConnectorExtraConfig(const nlohmann::json& extra, AfdConfig& config);

// The normalized connector_extra_config of config.connector.
nlohmann::ordered_json ConnectorExtraConfigToJson(const AfdConfig& config);

// Connector-specific constraints across fields. Throws afd::Error.
void ValidateConnectorRules(const AfdConfig& config);

}  // namespace afd

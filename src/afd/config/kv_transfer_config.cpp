#include "afd/config/kv_transfer_config.h"

#include "afd/common/error.h"
#include "afd/config/json_fields.h"

namespace afd {

KvTransferConfig ParseKvTransferConfig(const std::string& json_text) {
  using json_fields::GetInt;
  using json_fields::GetNumber;
  using json_fields::GetString;
  const std::string where = "kv_transfer_config";
  const nlohmann::json j = json_fields::ParseStrict(json_text, where);
  AFD_CHECK(j.is_object(), "{} must be a JSON object, got {}", where, json_fields::Describe(j));
  KvTransferConfig c;
  bool has_connector = false, has_role = false;
  for (const auto& [key, value] : j.items()) {
    const std::string path = where + "." + key;
    // vLLM's keys for other connectors: checked for their type, then ignored (with why).
    const auto ignore = [&](const char* why) {
      c.ignored.push_back(fmt::format("{} ({})", path, why));
    };
    if (value.is_null() && key != "kv_connector" && key != "kv_role") continue;  // vLLM's None
    if (key == "kv_buffer_device") {
      const std::string v = GetString(value, path);
      AFD_CHECK(!v.empty(), "{}: empty (cuda or cpu)", path);
      ignore(
          "rows stay in the engine's cache; kv_connector_extra_config.transport says how they "
          "travel");
    } else if (key == "kv_buffer_size") {
      GetNumber(value, path, 0, 1e18);
      ignore("no staging buffer: rows go from cache to cache");
    } else if (key == "kv_rank") {
      GetInt(value, path, 0, 1 << 20);
      ignore("producers and consumers pair per request through kv_transfer_params");
    } else if (key == "kv_parallel_size") {
      GetInt(value, path, 1, 1 << 20);
      ignore("any number of producers and consumers pair per request");
    } else if (key == "enable_permute_local_kv") {
      AFD_CHECK(value.is_boolean(), "{} must be true or false, got {}", path,
                json_fields::Describe(value));
      ignore("the rows' layout is the engine's on both sides");
    } else if (key == "kv_connector_module_path") {
      AFD_THROW(
          "{}: a Python connector module cannot be loaded by this runtime (its connector is "
          "AfdKvConnector)",
          path);
    } else if (key == "kv_load_failure_policy") {
      const std::string v = GetString(value, path);
      if (v == "fail") {
        c.load_failure_policy = KvTransferConfig::LoadFailurePolicy::kFail;
      } else if (v == "recompute") {
        c.load_failure_policy = KvTransferConfig::LoadFailurePolicy::kRecompute;
      } else {
        AFD_THROW("{}: '{}' (recompute or fail)", path, v);
      }
    } else if (key == "kv_connector") {
      const std::string v = GetString(value, path);
      AFD_CHECK(v == "AfdKvConnector",
                "{}: connector '{}' is not supported (this runtime's is 'AfdKvConnector')", path,
                v);
      has_connector = true;
    } else if (key == "kv_role") {
      const std::string v = GetString(value, path);
      if (v == "kv_producer") {
        c.role = KvTransferConfig::Role::kProducer;
      } else if (v == "kv_consumer") {
        c.role = KvTransferConfig::Role::kConsumer;
      } else if (v == "kv_both") {
        c.role = KvTransferConfig::Role::kBoth;
      } else {
        AFD_THROW("{}: '{}' is not a role (kv_producer, kv_consumer, kv_both)", path, v);
      }
      has_role = true;
    } else if (key == "kv_ip") {
      c.kv_ip = GetString(value, path);
      // Bound and announced to consumers (remote_host): a wildcard would reach no one.
      AFD_CHECK(!c.kv_ip.empty() && c.kv_ip != "0.0.0.0",
                "{}: '{}' -- give the address consumers reach this producer at (it is bound "
                "and announced as remote_host)",
                path, c.kv_ip);
    } else if (key == "kv_port") {
      c.kv_port = static_cast<int>(GetInt(value, path, 1, 65535));
    } else if (key == "engine_id") {
      c.engine_id = GetString(value, path);
    } else if (key == "kv_connector_extra_config") {
      AFD_CHECK(value.is_object(), "{} must be an object, got {}", path,
                json_fields::Describe(value));
      for (const auto& [k, v] : value.items()) {
        const std::string p = path + "." + k;
        if (k == "hold_timeout_s") {
          c.hold_timeout_s = GetNumber(v, p, 1e-3, 1e7);
        } else if (k == "transfer_timeout_s") {
          c.transfer_timeout_s = GetNumber(v, p, 1e-3, 1e7);
        } else if (k == "transport") {
          const std::string t = GetString(v, p);
          AFD_CHECK(t == "tcp" || t == "cuda_ipc", "{}: '{}' (tcp or cuda_ipc)", p, t);
          c.transport = t == "tcp" ? KvTransferConfig::Transport::kTcp
                                   : KvTransferConfig::Transport::kCudaIpc;
        } else {
          AFD_THROW("{}: unknown field (hold_timeout_s, transfer_timeout_s, transport)", p);
        }
      }
    } else {
      AFD_THROW(
          "{}: unknown field (kv_connector, kv_role, kv_ip, kv_port, engine_id, "
          "kv_connector_extra_config, kv_load_failure_policy; accepted and ignored: "
          "kv_buffer_device, kv_buffer_size, kv_rank, kv_parallel_size, enable_permute_local_kv)",
          path);
    }
  }
  AFD_CHECK(has_connector, "{}.kv_connector is required ('AfdKvConnector')", where);
  AFD_CHECK(has_role, "{}.kv_role is required (kv_producer, kv_consumer, kv_both)", where);
  return c;
}

}  // namespace afd

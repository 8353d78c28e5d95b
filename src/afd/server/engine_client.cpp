#include "afd/server/engine_client.h"

#include "afd/common/error.h"

namespace afd::server {

std::shared_ptr<const runtime::KvRows> EngineClient::ExportHeldKv(uint64_t id, double /*timeout_s*/,
                                                                  bool /*device_ok*/) {
  AFD_THROW("request {}: KV transfers are not supported by this server's engines", id);
}

void EngineClient::ReleaseHeldKv(uint64_t /*id*/) {}

runtime::KvLayout EngineClient::kv_cache_layout() const { return {}; }

}  // namespace afd::server

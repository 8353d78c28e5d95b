// One OpenAI server over its own model (preset:tiny unless told) and engine, optionally a KV
// producer or consumer (prefill/decode disaggregation tests: kv_transfer_api_test, pd_proxy_test).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/server/api/api_server.h"
#include "afd/server/local_engine_client.h"

namespace afd::server::test {

using json = nlohmann::ordered_json;

inline const std::string kSecret = "the deployment's secret, long enough";

// One server over its own model, backend and engine.
struct KvInstance {
  kernels::cpu::CpuBackend cpu;
  std::unique_ptr<model::MoeModel> model;
  std::unique_ptr<runtime::LocalStepRunner> runner;
  std::unique_ptr<LocalEngineClient> engine;
  std::unique_ptr<ApiServer> server;

  explicit KvInstance(
      std::optional<KvTransferConfig::Role> role, double transfer_timeout_s = 2,
      double hold_timeout_s = 480, const std::string& model_name = "preset:tiny",
      KvTransferConfig::LoadFailurePolicy on_failure = KvTransferConfig::LoadFailurePolicy::kFail) {
    model = model::OpenModel(model_name, model::OpenOptions{}, cpu);
    runner = std::make_unique<runtime::LocalStepRunner>(*model);
    engine = std::make_unique<LocalEngineClient>(*model, *runner,
                                                 runtime::EngineOptions{0, 0, false, 64, 0});
    ApiServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    if (role) {
      KvTransferConfig kv;
      kv.role = *role;
      kv.kv_port = 0;
      kv.transfer_timeout_s = transfer_timeout_s;
      kv.hold_timeout_s = hold_timeout_s;
      kv.load_failure_policy = on_failure;
      o.kv_transfer = kv;
      o.kv_secret = kSecret;
    }
    server = std::make_unique<ApiServer>(o, *engine, nullptr, nullptr);
    server->Start();
  }
  ~KvInstance() { server->Stop(); }

  std::pair<int, json> Post(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(30, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, nullptr};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
};

inline json Request(const std::vector<int32_t>& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
          {"logprobs", 2},    {"return_token_ids", true}};
}

inline std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 53 + 7) % 1000 + 2);
  return p;
}

}  // namespace afd::server::test

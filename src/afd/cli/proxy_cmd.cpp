// `afd proxy`: the client-facing endpoint of prefill/decode disaggregation (server/pd_proxy.h),
// with the seed's flags (vLLM's toy proxy's).
#include <CLI/CLI.hpp>
#include <iostream>

#include "afd/cli/commands.h"
#include "afd/comm/join_secret.h"
#include "afd/common/error.h"
#include "afd/common/stop_signals.h"
#include "afd/server/pd_proxy.h"

namespace afd::cli {

namespace {

// hosts x ports as instances: as many hosts as ports, or one host for every port.
std::vector<server::PdProxyOptions::Instance> Instances(const std::vector<std::string>& hosts,
                                                        const std::vector<int>& ports,
                                                        const char* what) {
  AFD_CHECK(!ports.empty(), "--{}-ports: give at least one port", what);
  AFD_CHECK(hosts.size() == ports.size() || hosts.size() == 1,
            "--{}-hosts gives {} hosts for {} --{}-ports (one host for all, or one per port)", what,
            hosts.size(), ports.size(), what);
  std::vector<server::PdProxyOptions::Instance> out;
  for (size_t i = 0; i < ports.size(); ++i) {
    out.push_back({hosts.size() == 1 ? hosts[0] : hosts[i], ports[i]});
  }
  return out;
}

}  // namespace

void AddProxyCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "proxy",
      "Prefill/decode disaggregation's endpoint: each request prefilled on a KV producer, "
      "decoded on a KV consumer (vLLM's toy proxy's flow; docs/pd.md)");
  struct Args {
    std::string host = "127.0.0.1";
    int port = 8000;
    std::vector<std::string> prefiller_hosts = {"127.0.0.1"}, decoder_hosts = {"127.0.0.1"};
    std::vector<int> prefiller_ports, decoder_ports;
    double timeout_s = 600;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--host", a->host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", a->port, "Port to listen on (default 8000)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--prefiller-hosts", a->prefiller_hosts, "Hosts of the prefill instances");
  cmd->add_option("--prefiller-ports", a->prefiller_ports, "Ports of the prefill instances")
      ->required();
  cmd->add_option("--decoder-hosts", a->decoder_hosts, "Hosts of the decode instances");
  cmd->add_option("--decoder-ports", a->decoder_ports, "Ports of the decode instances")->required();
  cmd->add_option("--timeout-s", a->timeout_s, "Each leg of a request, at most (default 600)")
      ->check(CLI::PositiveNumber);
  cmd->callback([a, &exit_code] {
    server::PdProxyOptions o;
    try {
      o.host = a->host;
      o.port = a->port;
      o.prefillers = Instances(a->prefiller_hosts, a->prefiller_ports, "prefiller");
      o.decoders = Instances(a->decoder_hosts, a->decoder_ports, "decoder");
      o.timeout_s = a->timeout_s;
      o.kv_secret = comm::LoadJoinSecret();
      o.Validate();
    } catch (const Error& e) {
      std::cerr << "afd proxy: " << e.what() << std::endl;
      exit_code = 2;
      return;
    }
    BlockStopSignals();
    exit_code = server::RunPdProxy(o);
  });
}

}  // namespace afd::cli

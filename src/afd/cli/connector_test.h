// Internals of `afd connector-test` shared by its files: the arguments and the two modes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "afd/cli/row_io.h"
#include "afd/comm/afd_world.h"
#include "afd/connector/p2p_connector.h"

namespace afd::cli {

struct ConnectorTestArgs {
  std::string additional_config;
  int role_rank = 0;
  int layers = 3;
  int stages = 2;
  int steps = 3;
  int64_t hidden = 64;
  std::string dtype = "f32";
  int max_rows = 13;
  int die_at_step = -1;
  bool bench = false;
  std::string bench_rows = "1,16,128,512";
  int iters = 20;
  std::string device = "cpu";
  int cuda_device = -1;
};

// Round-trip latency per layer for each row count (--bench); the FFN side echoes rows
// unchanged. Adds "bench": [{rows, bytes_each_way, median_us, p10_us, p90_us}] to `report`.
void RunConnectorBench(const ConnectorTestArgs& args, comm::AfdWorld& world,
                       connector::P2pConnector& conn, RowIo& io, nlohmann::json& report);

}  // namespace afd::cli

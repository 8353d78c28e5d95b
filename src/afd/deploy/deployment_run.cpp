#include "afd/deploy/deployment_run.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "afd/comm/join_secret.h"
#include "afd/comm/socket.h"
#include "afd/common/error.h"
#include "afd/common/temp_dir.h"
#include "afd/config/afd_config.h"
#include "afd/deploy/launcher.h"
#include "afd/deploy/rank_map.h"
#include "afd/deploy/transport.h"
#include "afd/topology/parallel.h"

namespace afd::deploy {

namespace {

using nlohmann::json;

// A temp directory removed when the run ends, unless `keep` (the logs of a failed run).
struct TempDir {
  std::string path;
  bool keep = false;
  TempDir() : path(MakePrivateTempDir("afd-run-")) {}
  ~TempDir() {
    std::error_code ignored;  // a destructor must not throw
    if (!keep) std::filesystem::remove_all(path, ignored);
  }
};

// The afd object of each role: the user's extra fields, then the deployment's own.
std::string RoleConfig(const json& base, Role role, int port, int A, int F, bool cuda) {
  json afd = base;
  afd["role"] = std::string(RoleName(role));
  afd["host"] = "127.0.0.1";
  afd["port"] = port;
  afd["num_attention_ranks"] = A;
  afd["num_ffn_ranks"] = F;
  const std::string text = json{{"afd", afd}}.dump();
  CheckConnectorImplemented(ParseAfdConfig(text), cuda);  // now, before any process starts
  return text;
}

// NCCL cannot put two ranks on one GPU: --cuda-devices given, no device twice.
bool OneDevicePerRank(std::vector<int> devices) {
  std::sort(devices.begin(), devices.end());
  return !devices.empty() && std::adjacent_find(devices.begin(), devices.end()) == devices.end();
}

}  // namespace

int NumGpus(const DeploymentSpec& spec) {
  if (!spec.cuda) return 0;
  if (spec.cuda_devices.empty()) return 1;
  std::vector<int> d = spec.cuda_devices;
  std::sort(d.begin(), d.end());
  return static_cast<int>(std::unique(d.begin(), d.end()) - d.begin());
}

std::vector<std::string> CudaWorkerFlags(const DeploymentSpec& spec, int cuda_device,
                                         const std::string& dtype) {
  std::vector<std::string> flags = {"--device", "cuda"};
  if (spec.cuda_devices.empty())
    flags.insert(flags.end(), {"--cuda-device", std::to_string(cuda_device)});
  if (!dtype.empty()) flags.insert(flags.end(), {"--dtype", dtype});
  return flags;
}

std::string DeploymentName(const DeploymentSpec& spec) {
  return spec.expert_parallel_size > 0 ? fmt::format("DP{}+EP", spec.expert_parallel_size)
                                       : spec.topology;
}

void CheckDataParallelExpertParallel(const DeploymentSpec& spec) {
  const int n = spec.expert_parallel_size;
  AFD_CHECK(spec.topology.empty(),
            "--enable-expert-parallel with --data-parallel-size is a deployment without AFD: "
            "leave out --topology {}",
            spec.topology);
  AFD_CHECK(n >= 1 && n <= 256, "--data-parallel-size {}: must be in 1..256 on one host", n);
  AFD_CHECK(spec.additional_config.empty(),
            "--additional-config configures AFD; a data-parallel + expert-parallel deployment "
            "takes none");
  AFD_CHECK(
      spec.attention_tp == 1 && spec.attention_dp == 0 && spec.ffn_dp == 0 && spec.ffn_tp == 1,
      "--attention-dp/--attention-tp/--ffn-dp/--ffn-tp are AFD's; a data-parallel + "
      "expert-parallel deployment has one rank per replica");
  AFD_CHECK(spec.cuda_devices.empty() || spec.cuda,
            "--cuda-devices places the ranks on GPUs: it needs --device cuda");
  AFD_CHECK(spec.cuda_devices.empty() || static_cast<int>(spec.cuda_devices.size()) == n,
            "--cuda-devices: {} devices for the {} data-parallel ranks (one per rank)",
            spec.cuda_devices.size(), n);
  if (spec.cuda && n > 1) {
    // The MoE rows go over NCCL, which cannot put two ranks on one GPU.
    AFD_CHECK(OneDevicePerRank(spec.cuda_devices),
              "a data-parallel + expert-parallel deployment on GPUs moves its MoE rows over "
              "NCCL, which cannot put two ranks on one GPU: give --cuda-devices one distinct "
              "device per rank ({} here)",
              n);
  }
}

namespace {

// The ranks of a data-parallel + expert-parallel deployment: each writes out<r>.jsonl and
// attention<r>.stats like an attention rank of AFD (RunDeployment reads them alike); without a
// prompts file each serves the frontend of `afd launch` (serves_engine).
std::vector<RankProcessSpec> DpEpRankSpecs(const DeploymentSpec& spec, const std::string& dir,
                                           const std::string& prompts_file) {
  CheckDataParallelExpertParallel(spec);
  const int n = spec.expert_parallel_size;
  const int port = comm::PickRendezvousPort();
  const std::string exe = SelfExe();
  std::vector<RankProcessSpec> specs;
  for (int r = 0; r < n; ++r) {
    RankProcessSpec s;
    s.label = fmt::format("attention+experts rank {}", r);
    s.log = fmt::format("{}/attention{}.log", dir, r);
    s.argv = {exe,
              "dp-ep-worker",
              "--exit-with-parent",
              std::to_string(getpid()),
              "--data-parallel-rank",
              std::to_string(r),
              "--data-parallel-size",
              std::to_string(n),
              "--rendezvous-port",
              std::to_string(port),
              "--stats-file",
              fmt::format("{}/attention{}.stats", dir, r)};
    if (!prompts_file.empty()) {
      s.argv.insert(s.argv.end(), {"--prompts-file", prompts_file, "--output-file",
                                   fmt::format("{}/out{}.jsonl", dir, r)});
    }
    s.serves_engine = prompts_file.empty();  // a replica of afd launch's frontend
    s.argv.insert(s.argv.end(), spec.worker_flags.begin(), spec.worker_flags.end());
    if (!spec.cuda_devices.empty()) {
      s.argv.insert(s.argv.end(), {"--cuda-device", std::to_string(spec.cuda_devices[r])});
      s.label += fmt::format(" (cuda:{})", spec.cuda_devices[r]);
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

}  // namespace

std::vector<RankProcessSpec> DeploymentRankSpecs(const DeploymentSpec& spec, const std::string& dir,
                                                 const std::string& prompts_file) {
  if (spec.expert_parallel_size > 0) return DpEpRankSpecs(spec, dir, prompts_file);
  std::smatch m;
  const std::regex shape("^([0-9]+)A([0-9]+)F$", std::regex::icase);
  AFD_CHECK(std::regex_match(spec.topology, m, shape),
            "--topology \"{}\": expected xAyF, e.g. 3A2F", spec.topology);
  const int A = std::stoi(m[1]), F = std::stoi(m[2]);
  AFD_CHECK(A >= 1 && F >= 1 && A <= 256 && F <= 256,
            "--topology {}: rank counts must be in 1..256 for a single-host run", spec.topology);
  // Left out, a role's DP size is its ranks over its TP size, which must then divide them.
  auto dp_of = [&](Role role, int ranks, int dp, int tp) {
    if (dp > 0) return dp;
    AFD_CHECK(tp >= 1 && ranks % tp == 0,
              "--topology {}: --{}-tp {} does not divide the {} {} ranks", spec.topology,
              role == Role::kAttention ? "attention" : "ffn", tp, ranks, RoleName(role));
    return ranks / tp;
  };
  const int attn_dp = dp_of(Role::kAttention, A, spec.attention_dp, spec.attention_tp);
  const int ffn_dp = dp_of(Role::kFfn, F, spec.ffn_dp, spec.ffn_tp);
  CheckRankRule(Role::kAttention, A, ParallelSizes{attn_dp, 1, spec.attention_tp});
  CheckRankRule(Role::kFfn, F, ParallelSizes{ffn_dp, 1, spec.ffn_tp});

  json base = json::object();
  // GPU ranks exchange rows through CUDA IPC windows (the async connector), CPU ranks over TCP
  // unless the config asks for shared-memory windows.
  std::string connector(spec.cuda ? kAsyncConnector : kP2pHostConnector);
  // The deployment's config as every rank will parse it (rank counts and connector filled in).
  AfdConfig deployed;
  deployed.connector = connector;
  deployed.num_attention_ranks = A;
  deployed.num_ffn_ranks = F;
  if (!spec.additional_config.empty()) {
    json given;
    try {
      given = json::parse(spec.additional_config);
    } catch (const json::exception& e) {
      AFD_THROW("--additional-config: not valid JSON: {}", e.what());
    }
    base = given.contains("afd") ? given["afd"] : given;
    // Checks the fields, with the topology's rank counts and the device's connector where the
    // config leaves them out (the connector's options are validated against them).
    json probe = base;
    if (probe.is_object() && !probe.contains("num_attention_ranks"))
      probe["num_attention_ranks"] = A;
    if (probe.is_object() && !probe.contains("num_ffn_ranks")) probe["num_ffn_ranks"] = F;
    if (probe.is_object() && !probe.contains("connector") && !probe.contains("afd_connector"))
      probe["connector"] = connector;
    const AfdConfig parsed = ParseAfdConfig(json{{"afd", probe}}.dump());
    deployed = parsed;
    for (const char* k : {"role", "afd_role", "host", "afd_host", "port", "afd_port"}) {
      AFD_CHECK(!base.contains(k),
                "--additional-config: \"{}\" is set by --topology; leave it "
                "out",
                k);
    }
    AFD_CHECK(!base.contains("num_attention_ranks") || parsed.num_attention_ranks == A,
              "--additional-config: num_attention_ranks {} contradicts --topology {}",
              parsed.num_attention_ranks, spec.topology);
    AFD_CHECK(!base.contains("num_ffn_ranks") || parsed.num_ffn_ranks == F,
              "--additional-config: num_ffn_ranks {} contradicts --topology {}",
              parsed.num_ffn_ranks, spec.topology);
    if (base.contains("connector") || base.contains("afd_connector")) {
      if (spec.cuda) {
        AFD_CHECK(parsed.is_async() || parsed.connector == kP2pNcclConnector,
                  "--additional-config: connector {}: a GPU deployment uses AsyncAFDConnector or "
                  "GpuAsyncAFDConnector (CUDA IPC or NCCL windows), or P2pNcclAFDConnector (one "
                  "GPU per rank: --cuda-devices)",
                  parsed.connector);
      } else {
        AFD_CHECK(parsed.connector == kP2pHostConnector || parsed.connector == kAsyncConnector,
                  "--additional-config: connector {} needs GPUs; a CPU deployment uses "
                  "P2pHostAFDConnector or AsyncAFDConnector",
                  parsed.connector);
      }
      connector = parsed.connector;
    }
  }
  base.erase("afd_connector");
  base["connector"] = connector;
  AFD_CHECK(spec.cuda_devices.empty() || spec.cuda,
            "--cuda-devices places the ranks on GPUs: it needs --device cuda");
  AFD_CHECK(spec.cuda_devices.empty() || static_cast<int>(spec.cuda_devices.size()) == A + F,
            "--cuda-devices: {} devices for the {} ranks of {} (one per world rank: the {} FFN "
            "ranks first, then the {} attention ranks)",
            spec.cuda_devices.size(), A + F, spec.topology, F, A);
  for (int d : spec.cuda_devices) {
    AFD_CHECK(d >= 0, "--cuda-devices: {} is not a CUDA device ordinal", d);
  }
  // NCCL refuses two ranks on one GPU: the NCCL transports need --cuda-devices, one GPU each.
  const bool p2p_nccl = connector == kP2pNcclConnector;
  const bool nccl = p2p_nccl || (deployed.is_async() && deployed.async_options.window == "nccl");
  if (spec.cuda && nccl) {
    AFD_CHECK(OneDevicePerRank(spec.cuda_devices),
              "{} puts every rank on its own GPU (NCCL cannot put two ranks on one): give "
              "--cuda-devices one distinct device per world rank ({} here, FFN ranks first), or "
              "let the ranks share GPUs through AsyncAFDConnector's CUDA IPC windows",
              p2p_nccl ? "P2pNcclAFDConnector" : "the NCCL window (window \"nccl\")", A + F);
  }
  const int port = comm::PickRendezvousPort();

  const std::string exe = SelfExe();
  std::vector<RankProcessSpec> specs;
  for (Role role : {Role::kFfn, Role::kAttention}) {
    const bool attn = role == Role::kAttention;
    const std::string cfg = RoleConfig(base, role, port, A, F, spec.cuda);
    const int n = attn ? A : F, dp = attn ? attn_dp : ffn_dp,
              tp = attn ? spec.attention_tp : spec.ffn_tp;
    for (int r = 0; r < n; ++r) {
      RankProcessSpec s;
      s.label = fmt::format("{} rank {}", RoleName(role), r);
      s.log = fmt::format("{}/{}{}.log", dir, RoleName(role), r);
      s.argv = {exe,
                "worker",
                "--exit-with-parent",
                std::to_string(getpid()),
                "--role-rank",
                std::to_string(r),
                "--additional-config",
                cfg,
                "--data-parallel-size",
                std::to_string(dp),
                "--tensor-parallel-size",
                std::to_string(tp),
                "--stats-file",
                fmt::format("{}/{}{}.stats", dir, RoleName(role), r)};
      if (attn && !prompts_file.empty()) {
        s.argv.insert(s.argv.end(), {"--prompts-file", prompts_file, "--output-file",
                                     fmt::format("{}/out{}.jsonl", dir, r)});
      }
      s.serves_engine = attn && prompts_file.empty();
      s.argv.insert(s.argv.end(), spec.worker_flags.begin(), spec.worker_flags.end());
      if (!spec.cuda_devices.empty()) {
        const int world_rank = attn ? F + r : r;
        s.argv.insert(s.argv.end(),
                      {"--cuda-device", std::to_string(spec.cuda_devices[world_rank])});
        s.label += fmt::format(" (cuda:{})", spec.cuda_devices[world_rank]);
      }
      specs.push_back(std::move(s));
    }
  }
  if (spec.show_rank_map) std::cerr << TopologyText(Topology(A, F));
  return specs;
}

std::vector<DeploymentResult> RunDeployment(const DeploymentSpec& spec,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            std::vector<json>* attention_stats) {
  // The ranks that generate: the attention ranks (TP rank 0 of each replica writes), or every
  // rank of a data-parallel + expert-parallel deployment.
  int A = spec.expert_parallel_size;
  if (A == 0) {
    std::smatch m;
    const std::regex shape("^([0-9]+)A([0-9]+)F$", std::regex::icase);
    AFD_CHECK(std::regex_match(spec.topology, m, shape),
              "--topology \"{}\": expected xAyF, e.g. 3A2F", spec.topology);
    A = std::stoi(m[1]);
  }
  TempDir dir;
  const std::string prompts_file = dir.path + "/prompts.json";
  std::ofstream(prompts_file) << json(prompts).dump();
  const std::vector<RankProcessSpec> specs = DeploymentRankSpecs(spec, dir.path, prompts_file);
  comm::EnsureLocalJoinSecret();  // every rank is a child of this process: one fresh secret
  try {
    RunRankProcesses(specs);
  } catch (const Error& e) {
    dir.keep = true;
    AFD_THROW("{}(all logs kept in {})", e.what(), dir.path);
  }

  std::vector<DeploymentResult> results(prompts.size());
  std::vector<bool> seen(prompts.size(), false);
  for (int r = 0; r < A; ++r) {
    if (r % spec.attention_tp != 0) continue;  // TP rank 0 of each replica writes
    std::ifstream in(fmt::format("{}/out{}.jsonl", dir.path, r));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      const size_t i = j["index"].get<size_t>();
      AFD_CHECK(i < prompts.size() && !seen[i],
                "attention rank {} returned prompt {} twice or "
                "out of range",
                r, i);
      seen[i] = true;
      // Keep the worker's text as is: re-serializing would reorder keys and reprint floats.
      const std::string marker = "\"result\": ";
      const size_t at = line.find(marker);
      AFD_CHECK(at != std::string::npos && line.back() == '}',
                "attention rank {} wrote a malformed result line", r);
      results[i].json_line = line.substr(at + marker.size(), line.size() - 1 - at - marker.size());
      results[i].prompt_ids = j["result"]["prompt_ids"].get<std::vector<int32_t>>();
      results[i].output_ids = j["result"]["output_ids"].get<std::vector<int32_t>>();
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    AFD_CHECK(seen[i], "no attention rank returned a result for prompt {}", i);
  }
  if (attention_stats != nullptr) {
    attention_stats->clear();
    for (const auto& s : specs) {
      if (s.label.rfind("attention", 0) != 0) continue;
      std::ifstream in(s.log.substr(0, s.log.size() - 4) + ".stats");
      std::string line;
      std::getline(in, line);
      AFD_CHECK(!line.empty(), "{} wrote no stats ({})", s.label, s.log);
      attention_stats->push_back(json::parse(line));
    }
  }
  if (spec.print_stats) {
    for (const auto& s : specs) {
      std::ifstream in(s.log.substr(0, s.log.size() - 4) + ".stats");
      std::string line;
      std::getline(in, line);
      if (line.empty()) continue;
      const json st = json::parse(line);
      std::cerr << fmt::format("{}: {} steps", s.label, st["steps"].get<int64_t>());
      if (st.contains("drain_steps")) {
        std::cerr << fmt::format(", {} drain steps", st["drain_steps"].get<int64_t>());
      }
      if (st.value("dbo_steps", int64_t{0}) > 0) {
        std::cerr << fmt::format(" ({} as two micro-batches)", st["dbo_steps"].get<int64_t>());
      }
      if (st.value("mixed_steps", int64_t{0}) > 0) {
        std::cerr << fmt::format(", {} mixed prefill+decode steps",
                                 st["mixed_steps"].get<int64_t>());
      }
      if (st.value("graph_steps", int64_t{0}) > 0 || st.value("graph_items", int64_t{0}) > 0) {
        std::cerr << fmt::format(", {} replayed from CUDA graphs ({} captured)",
                                 st.value("graph_steps", st.value("graph_items", int64_t{0})),
                                 st["graph_captures"].get<int64_t>());
        if (st.value("items_ahead", int64_t{0}) > 0) {
          std::cerr << fmt::format(", {} of them enqueued ahead of their rows",
                                   st["items_ahead"].get<int64_t>());
        }
      }
      if (st.value("groups", int64_t{0}) > 0) {
        std::cerr << fmt::format(", {} work items gathered into {} expert passes",
                                 st["gathered_items"].get<int64_t>(), st["groups"].get<int64_t>());
      }
      if (st.contains("expert_range")) {  // a data-parallel + expert-parallel rank
        std::cerr << fmt::format(", experts [{}, {})", st["expert_range"][0].get<int64_t>(),
                                 st["expert_range"][1].get<int64_t>());
      }
      if (st.contains("experts")) {
        std::cerr << fmt::format(", experts [{}, {}), {} rows", st["experts"][0].get<int64_t>(),
                                 st["experts"][1].get<int64_t>(), st["rows"].get<int64_t>());
      }
      if (st.contains("decode_steps") && st["decode_steps"].get<int64_t>() > 0) {
        const double ds = st["decode_seconds"].get<double>();
        std::cerr << fmt::format(
            "; prefill {} tokens in {:.4f} s; decode {} tokens in {} steps, {:.4f} s = {:.1f} "
            "tokens/s ({:.2f} ms/step)",
            st["prefill_tokens"].get<int64_t>(), st["prefill_seconds"].get<double>(),
            st["decode_tokens"].get<int64_t>(), st["decode_steps"].get<int64_t>(), ds,
            st["decode_tokens"].get<int64_t>() / std::max(ds, 1e-9),
            1e3 * ds / st["decode_steps"].get<int64_t>());
      }
      std::cerr << "\n";
      for (const auto& l : st["transfers"]) {
        std::cerr << fmt::format("    layer {} {}: {} messages, {} bytes, {:.3f} ms",
                                 l["layer"].get<int64_t>(), l.value("direction", ""),
                                 l["messages"].get<int64_t>(), l["bytes"].get<int64_t>(),
                                 1e3 * l["seconds"].get<double>());
        const int64_t tokens = l.value("tokens", int64_t{0});
        if (tokens > 0) {  // the async connector: bytes per token of one message (one peer)
          std::cerr << fmt::format(", {:.1f} B per token per peer",
                                   static_cast<double>(l["bytes"].get<int64_t>()) / tokens);
        }
        std::cerr << "\n";
      }
    }
  }
  return results;
}

}  // namespace afd::deploy

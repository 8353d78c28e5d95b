// Runs the `afd` binary as a user would and checks its output and exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "testing/command.h"

namespace {

using nlohmann::json;

using Result = afd::testing_util::CommandResult;  // out: stdout and stderr together
using afd::testing_util::Quote;

Result RunAfd(const std::string& args, bool stderr_too = true) {
  return afd::testing_util::RunCommand(std::string(AFD_BINARY) + " " + args +
                                       (stderr_too ? " 2>&1" : " 2>/dev/null"));
}

// A connector the config accepts but this build cannot run is refused before anything starts,
// never replaced by another one.
TEST(Cli, ConnectorThatCannotRunHereIsRefusedAtStartup) {
  // GPU windows on CPU ranks.
  const std::string cfg = Quote(R"({"afd": {"role": "ffn", "connector": "GpuAsyncAFDConnector", )"
                                R"("num_attention_ranks": 1, "num_ffn_ranks": 1, "port": 1}})");
  Result r = RunAfd("config check " + cfg);
  EXPECT_EQ(r.exit_code, 0) << r.out;  // a valid config...
  for (const std::string& cmd :
       {"serve --model preset:tiny --additional-config " + cfg,
        "worker --model preset:tiny --role-rank 0 --additional-config " + cfg}) {
    r = RunAfd(cmd);  // ...that cannot run on the CPU
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("GpuAsyncAFDConnector keeps its rows in GPU memory"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("--device cuda"), std::string::npos) << r.out;
  }
  r = RunAfd("connector-test --role-rank 0 --additional-config " + cfg);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("GPU memory"), std::string::npos) << r.out;
  // Host-row P2P connectors on GPU ranks.
  const std::string p2p = Quote(R"({"afd": {"role": "ffn", "connector": "P2pHostAFDConnector", )"
                                R"("num_attention_ranks": 1, "num_ffn_ranks": 1, "port": 1}})");
  r = RunAfd("worker --model preset:tiny --role-rank 0 --device cuda --additional-config " + p2p);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("it moves host rows over TCP"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("P2pNcclAFDConnector"), std::string::npos) << r.out;
  // NCCL symmetric-memory windows on CPU ranks.
  const std::string nccl = Quote(
      R"({"afd": {"role": "ffn", "connector": "AsyncAFDConnector", "num_attention_ranks": 1, )"
      R"("num_ffn_ranks": 1, "port": 1, "connector_extra_config": {"window": "nccl"}}})");
  r = RunAfd("worker --model preset:tiny --role-rank 0 --additional-config " + nccl);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("window \"nccl\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--device cuda"), std::string::npos) << r.out;
  r = RunAfd(
      "run --model preset:tiny --prompt-ids 1,2 --max-tokens 1 --topology 1A1F "
      "--additional-config " +
      Quote(R"({"afd": {"connector": "AsyncAFDConnector", "connector_extra_config": )"
            R"({"window": "nccl"}}})"));
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("window \"nccl\""), std::string::npos) << r.out;
}

// --cuda-devices places ranks on GPUs: CPU runs refuse it before anything starts (exit 2).
TEST(Cli, CudaDevicesNeedCudaRanks) {
  const std::string ffn = Quote(
      R"({"afd": {"role": "ffn", "connector": "P2pHostAFDConnector", "num_attention_ranks": 1, )"
      R"("num_ffn_ranks": 1, "port": 1}})");
  for (const std::string& cmd : std::vector<std::string>{
           "serve --model preset:tiny --cuda-devices 0 --additional-config " + ffn,
           "run --model preset:tiny --prompt-ids 1,2 --max-tokens 1 --topology 1A1F "
           "--cuda-devices 0,1",
           "run --model preset:tiny --prompt-ids 1,2 --max-tokens 1 --cuda-devices 0",
           "bench decode --model preset:tiny --batch 1 --steps 1 --cuda-devices 0"}) {
    const Result r = RunAfd(cmd);
    EXPECT_NE(r.exit_code, 0) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("--cuda-devices"), std::string::npos) << cmd << "\n" << r.out;
  }
}

// Bad `afd run` input is refused before anything starts, naming the flag and the cause.
TEST(Cli, RunRefusesBadInputNamingTheFlag) {
  const std::string run = "run --model preset:tiny --prompt-ids 1,2,3 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      // prompt + new tokens over --max-model-len (as the serving engine refuses a request)
      {"--max-tokens 16 --max-model-len 18",
       "3 tokens + --max-tokens 16 exceed --max-model-len 18"},
      {"--max-model-len 999999", "--max-model-len 999999 exceeds the model's"},
      {"--topology 2A1F --attention-tp 3",
       "--attention-tp 3 does not divide the 2 attention ranks"},
      {"--topology 2A3F --ffn-tp 2", "--ffn-tp 2 does not divide the 3 ffn ranks"},
      {"--topology 2A1F --attention-tp 0", "--attention-tp: must be a positive number, got \"0\""},
      {"--topology 1A1F --additional-config '{bad'", "--additional-config: not valid JSON"},
  };
  for (const auto& [flags, message] : cases) {
    const Result r = RunAfd(run + flags);
    EXPECT_NE(r.exit_code, 0) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << flags << "\n" << r.out;
  }
  // At the limit it runs.
  const Result ok = RunAfd(run + "--max-tokens 2 --max-model-len 5");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  // afd launch refuses a limit past the model's before any rank starts.
  const Result launch =
      RunAfd("launch --model preset:tiny --topology 1A1F --port 1 --max-model-len 99999");
  EXPECT_NE(launch.exit_code, 0) << launch.out;
  EXPECT_NE(launch.out.find("--max-model-len 99999 exceeds the model's"), std::string::npos)
      << launch.out;
  EXPECT_EQ(launch.out.find("processes"), std::string::npos) << launch.out;
  // So does afd serve, before the weights load (no "KV cache" line).
  const Result serve = RunAfd("serve --model preset:tiny --port 1 --max-model-len 99999");
  EXPECT_EQ(serve.exit_code, 2) << serve.out;
  EXPECT_NE(serve.out.find("afd serve: --max-model-len 99999 exceeds the model's"),
            std::string::npos)
      << serve.out;
  EXPECT_EQ(serve.out.find("KV cache"), std::string::npos) << serve.out;
}

TEST(Cli, VersionAndHelp) {
  Result r = RunAfd("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("afd 0."), std::string::npos);
  r = RunAfd("--help-env");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("AFD_CPU_GEMM=portable, avx2 or avx512"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("AFD_JOIN_SECRET_FILE="), std::string::npos) << r.out;
  for (const char* sub : {"--help", "topology --help", "config --help", "config check --help"}) {
    r = RunAfd(sub);
    EXPECT_EQ(r.exit_code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
  }
}

TEST(Cli, TopologyJson4A2F) {
  const Result r = RunAfd("topology --attention 4 --ffn 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out), json::parse(R"({"attention": 4, "ffn": 2,
    "world": [{"rank": 0, "role": "ffn", "role_rank": 0}, {"rank": 1, "role": "ffn", "role_rank": 1},
              {"rank": 2, "role": "attention", "role_rank": 0},
              {"rank": 3, "role": "attention", "role_rank": 1},
              {"rank": 4, "role": "attention", "role_rank": 2},
              {"rank": 5, "role": "attention", "role_rank": 3}],
    "subgroups": [{"index": 0, "members": [0, 2, 3]}, {"index": 1, "members": [1, 4, 5]}],
    "control_plane": {"members": [0, 1, 2, 3],
                      "routes": [{"attention": 0, "ffn": [0]}, {"attention": 1, "ffn": [1]}]}})"));
}

TEST(Cli, TopologyJson2A5F) {
  const Result r = RunAfd("topology --attention 2 --ffn 5 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["subgroups"], json::parse(R"([{"index": 0, "members": [0, 1, 2, 5]},
                                             {"index": 1, "members": [3, 4, 6]}])"));
  EXPECT_EQ(j["control_plane"]["members"], json::parse("[0, 1, 2, 3, 4, 5, 6]"));
  EXPECT_EQ(j["control_plane"]["routes"], json::parse(R"([{"attention": 0, "ffn": [0, 2, 4]},
                                                          {"attention": 1, "ffn": [1, 3]}])"));
}

TEST(Cli, TopologyTextLikeSeedWorkedExample) {
  const Result r = RunAfd("topology --attention 4 --ffn 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("AFD world (port):        F0=0  F1=1  A0=2  A1=3  A2=4  A3=5"),
            std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find("subgroup 0 (prefix afd_subgroup_0):   F0(rank 0) <-> A0(rank 1), A1(rank 2)"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find("subgroup 1 (prefix afd_subgroup_1):   F1(rank 0) <-> A2(rank 1), A3(rank 2)"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("p2p ranks:             F0=0  F1=1  A0=2  A1=3      (A2, A3 excluded)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("metadata flow:         A0 -> F0,   A1 -> F1"), std::string::npos) << r.out;
}

TEST(Cli, TopologyRejectsBadCounts) {
  for (const char* args : {"topology --attention 0 --ffn 2", "topology --attention 2",
                           "topology --attention x --ffn 1", "topology --attention 2 --ffn -1"}) {
    const Result r = RunAfd(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.out;
  }
}

TEST(Cli, ConfigCheckValidPrintsNormalized) {
  const Result r =
      RunAfd("config check " + Quote(R"({"afd": {"afd_role": "ffn", "num_ffn_ranks": 2}})"),
             /*stderr_too=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["role"], "ffn");
  EXPECT_EQ(j["num_ffn_ranks"], 2);
  EXPECT_EQ(j["port"], 1239);
  EXPECT_FALSE(j.contains("afd_role"));
}

TEST(Cli, ConfigCheckFile) {
  const std::string path = testing::TempDir() + "/afd_cfg.json";
  std::ofstream(path) << R"({"role": "attention", "port": 6239, "num_attention_ranks": 3})";
  Result r = RunAfd("config check --file " + path, false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["num_attention_ranks"], 3);
  r = RunAfd("config check --file /nonexistent/afd.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("/nonexistent/afd.json"), std::string::npos) << r.out;
}

TEST(Cli, ConfigCheckInvalidExits2NamingField) {
  Result r = RunAfd("config check " + Quote(R"({"afd": {"port": 70000}})"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("afd.port"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("70000"), std::string::npos) << r.out;
  r = RunAfd("config check " + Quote("not json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("not valid JSON"), std::string::npos) << r.out;
  r = RunAfd("config check");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace

namespace {

TEST(Cli, ConnectorTestOnCudaWithoutAGpuFailsClearly) {
  // This machine has no GPU (or this build no CUDA): either way a clear error, exit 1.
  const Result r = RunAfd(
      "connector-test --device cuda --role-rank 0 --additional-config "
      "'{\"afd\": {\"role\": \"ffn\", \"connector\": \"P2pNcclAFDConnector\", \"port\": 1}}'");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(r.out.find("no usable CUDA device") != std::string::npos ||
              r.out.find("built without CUDA") != std::string::npos)
      << r.out;
}

}  // namespace

namespace {

// `afd bench decode --topology`: the decode bench through AFD rank processes (the async
// connector here), one row per batch size with positive figures; one-process options refused.
TEST(Cli, BenchDecodeOnATopology) {
  const Result r = RunAfd(
      "bench decode --model preset:tiny --batch 1,3 --context 8 --steps 4 --topology 2A1F --json "
      "--additional-config '{\"afd\": {\"connector\": \"AsyncAFDConnector\"}}'",
      /*stderr_too=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["topology"], "2A1F");
  ASSERT_EQ(j["rows"].size(), 2u) << r.out;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["rows"][i]["batch"], i == 0 ? 1 : 3);
    EXPECT_GT(j["rows"][i]["ms_per_step"].get<double>(), 0.0);
    EXPECT_GT(j["rows"][i]["tokens_per_s"].get<double>(), 0.0);
  }
  // The monolithic baseline: data-parallel ranks with the MoE expert-parallel over them.
  const Result ep = RunAfd(
      "bench decode --model preset:tiny --batch 1,3 --context 8 --steps 4 --data-parallel-size 2 "
      "--enable-expert-parallel --json",
      /*stderr_too=*/false);
  ASSERT_EQ(ep.exit_code, 0) << ep.out;
  const nlohmann::json e = nlohmann::json::parse(ep.out);
  EXPECT_EQ(e["topology"], "DP2+EP");
  ASSERT_EQ(e["rows"].size(), 2u) << ep.out;
  EXPECT_GT(e["rows"][1]["tokens_per_s"].get<double>(), 0.0);
  const Result no_ep = RunAfd("bench decode --model preset:tiny --data-parallel-size 2");
  EXPECT_EQ(no_ep.exit_code, 2) << no_ep.out;
  EXPECT_NE(no_ep.out.find("--enable-expert-parallel"), std::string::npos) << no_ep.out;
  const Result both = RunAfd(
      "run --model preset:tiny --prompt-ids 1 --data-parallel-size 2 --enable-expert-parallel "
      "--topology 1A1F");
  EXPECT_EQ(both.exit_code, 2) << both.out;
  EXPECT_NE(both.out.find("leave out --topology"), std::string::npos) << both.out;
  const Result no_topology = RunAfd("launch --model preset:tiny");
  EXPECT_EQ(no_topology.exit_code, 2) << no_topology.out;
  EXPECT_NE(no_topology.out.find("--enable-expert-parallel"), std::string::npos) << no_topology.out;
  const Result bad = RunAfd("bench decode --model preset:tiny --topology 1A1F --profile");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("one-process options"), std::string::npos) << bad.out;
  const Result shape = RunAfd("bench decode --model preset:tiny --topology 1X1F --batch 1");
  EXPECT_EQ(shape.exit_code, 1) << shape.out;
  EXPECT_NE(shape.out.find("expected xAyF"), std::string::npos) << shape.out;
}

// --context-mix: one batch of COUNTxTOKENS sequences, in the report's header; malformed, or
// beside --batch or --topology, refused naming it.
TEST(Cli, BenchDecodeContextMix) {
  const Result ok = RunAfd("bench decode --model preset:tiny --context-mix 1x40,2x8 --steps 2");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_NE(ok.out.find("context mix 1x40+2x8"), std::string::npos) << ok.out;
  const Result json =
      RunAfd("bench decode --model preset:tiny --context-mix 1x40,2x8 --steps 2 --json");
  EXPECT_NE(json.out.find("\"context_mix\":[[1,40],[2,8]]"), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"batch\":3"), std::string::npos) << json.out;
  for (const char* bad : {"--context-mix 1y40", "--context-mix 0x40", "--context-mix 1x40,",
                          "--context-mix 1x40 --batch 3", "--context-mix 1x40 --topology 1A1F"}) {
    const Result r = RunAfd(std::string("bench decode --model preset:tiny ") + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--context-mix"), std::string::npos) << bad << ": " << r.out;
  }
}

// --kernel-trace follows CUDA graph replays: the CPU backend (no kernels) and eager steps are
// refused with the reason.
TEST(Cli, KernelTraceNeedsGraphReplays) {
  const Result cpu = RunAfd("bench decode --model preset:tiny --batch 1 --steps 1 --kernel-trace");
  EXPECT_NE(cpu.exit_code, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("cpu: no kernel trace on this backend"), std::string::npos) << cpu.out;
  const Result eager =
      RunAfd("bench decode --model preset:tiny --batch 1 --steps 1 --kernel-trace --enforce-eager");
  EXPECT_NE(eager.exit_code, 0) << eager.out;
  EXPECT_NE(eager.out.find("not with --profile or --enforce-eager"), std::string::npos)
      << eager.out;
  const Result topology =
      RunAfd("bench decode --model preset:tiny --batch 1 --topology 1A1F --kernel-trace");
  EXPECT_EQ(topology.exit_code, 2) << topology.out;
  EXPECT_NE(topology.out.find("one-process options"), std::string::npos) << topology.out;
  // With a deployment: every rank's trace, of GPU ranks only.
  const Result ranks = RunAfd(
      "bench decode --model preset:tiny --batch 1 --topology 1A1F --kernel-trace-csv /tmp/k.csv");
  EXPECT_EQ(ranks.exit_code, 2) << ranks.out;
  EXPECT_NE(ranks.out.find("an AFD --topology on --device cuda only"), std::string::npos)
      << ranks.out;
  const Result csv = RunAfd(
      "bench decode --model preset:tiny --batch 1 --steps 1 --kernel-trace-csv /nonexistent/k.csv");
  EXPECT_EQ(csv.exit_code, 2) << csv.out;
  EXPECT_NE(csv.out.find("--kernel-trace-csv /nonexistent/k.csv: cannot open it for writing"),
            std::string::npos)
      << csv.out;
}

}  // namespace

namespace {

// Each command must fail with exit 2 and say `want` (before any model loads or port binds).
void ExpectRefused(const std::string& args, const std::string& want) {
  const Result r = RunAfd(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(want), std::string::npos) << args << "\n" << r.out;
}

}  // namespace

// A flag is honoured or refused by name; vLLM's flags that afd lacks say so (not CLI11's
// "arguments were not expected" with the words reversed).
TEST(Cli, FlagsAServerCannotHonourAreRefusedByName) {
  const std::string serve = "serve --model preset:tiny --port 0 ";
  ExpectRefused(serve + "--data-parallel-backend mp",
                "afd serve: --data-parallel-backend is not supported by afd (a vLLM flag");
  ExpectRefused(serve + "--trust-remote-code", "--trust-remote-code is not supported by afd");
  // vLLM's prefill/decode flag is afd serve's own (docs/pd.md): its JSON is checked by name.
  ExpectRefused(serve + "--kv-transfer-config '{}'", "kv_transfer_config.kv_connector is required");
  ExpectRefused(serve + "--no-such-flag=3",
                "--no-such-flag is not supported by afd (`afd serve --help`");
  ExpectRefused("run --model preset:tiny --prompt-ids 1 --bogus",
                "afd run: --bogus is not supported by afd");
  // In one process: no roles to overlap, no tensor parallelism, DP only as DP + EP replicas.
  ExpectRefused(serve + "--enable-dbo", "--enable-dbo: dual-batch overlap pipelines AFD's");
  ExpectRefused(serve + "--dbo-decode-token-threshold 4", "--dbo-decode-token-threshold:");
  ExpectRefused(serve + "--tensor-parallel-size 2", "--tensor-parallel-size 2: a model served");
  ExpectRefused(serve + "--data-parallel-size 2",
                "--data-parallel-size 2 without --enable-expert-parallel");
  ExpectRefused(serve + "--data-parallel-start-rank 1", "--data-parallel-start-rank places");
  ExpectRefused(serve + "--headless", "--headless places the DP ranks of an AFD role");
  ExpectRefused(serve + "--cuda-devices 0,1", "--cuda-devices places several ranks");
  // Sampling defaults are checked as `afd run` checks them; batch-only flags are refused.
  ExpectRefused(serve + "--temperature -1", "--temperature / --top-k / --top-p");
  ExpectRefused(serve + "--top-p 5", "top_p must be in (0, 1]");
  ExpectRefused(serve + "--top-k -5", "top_k must be >= 0");
  ExpectRefused(serve + "--max-tokens 0", "--max-tokens 0: a server's default must be at least 1");
  ExpectRefused(serve + "--prompt-logprobs", "--prompt-logprobs belongs to `afd run`");
  ExpectRefused("launch --model preset:tiny --topology 1A1F --port 0 --temperature -1",
                "--temperature / --top-k / --top-p");
  // The FFN role answers no API.
  const std::string ffn = Quote(R"({"afd": {"role": "ffn", "num_attention_ranks": 1, )"
                                R"("num_ffn_ranks": 1, "port": 1}})");
  for (const char* flag :
       {"--api-key k", "--served-model-name m", "--max-logprobs 3", "--max-waiting-requests 3"}) {
    ExpectRefused("serve --model preset:tiny --additional-config " + ffn + " " + flag,
                  std::string(flag).substr(0, std::string(flag).find(' ')) +
                      " configures the OpenAI API, which the FFN role does not answer");
  }
  // Multi-host DP: a headless host needs the API server's address; an API server running part
  // of the DP ranks needs one to listen on; the FFN role has no such listener.
  const std::string attn = Quote(R"({"afd": {"role": "attention", "num_attention_ranks": 2, )"
                                 R"("num_ffn_ranks": 1, "port": 1}})");
  const std::string attn_serve =
      "serve --model preset:tiny --data-parallel-size 2 --additional-config " + attn + " ";
  ExpectRefused(attn_serve + "--headless --data-parallel-size-local 1 --data-parallel-start-rank 1",
                "--headless needs --data-parallel-address and --data-parallel-rpc-port");
  ExpectRefused(attn_serve + "--data-parallel-size-local 1",
                "this host runs 1 of the 2 DP ranks (--data-parallel-size-local): the others "
                "connect to its API server, which needs --data-parallel-address");
  ExpectRefused(attn_serve +
                    "--headless --data-parallel-address 10.1.2.3 "
                    "--data-parallel-rpc-port 13345 --data-parallel-size-local 1",
                "--data-parallel-address 10.1.2.3: the rendezvous host 10.1.2.3 is not a "
                "loopback address");
  ExpectRefused(
      "serve --model preset:tiny --additional-config " + ffn + " --data-parallel-address 127.0.0.1",
      "--data-parallel-address belongs to the attention role");
  ExpectRefused(attn_serve +
                    "--headless --api-key k --data-parallel-address 127.0.0.1 "
                    "--data-parallel-rpc-port 13345 --data-parallel-size-local 1",
                "--api-key configures the OpenAI API, which a headless host does not answer");
  ExpectRefused(attn_serve + "--prompts-file /dev/null --data-parallel-rpc-port 13345",
                "--data-parallel-rpc-port: an attention role with --prompts-file has no engine");
  // `afd serve MODEL` as `vllm serve MODEL`; one model only.
  ExpectRefused("serve preset:tiny --model preset:other", "the model is given twice");
  ExpectRefused("serve --port 0", "--model is required");
}

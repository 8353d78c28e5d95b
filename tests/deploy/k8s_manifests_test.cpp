// `afd k8s`'s manifests: the layout (every DP rank in exactly one pod, GPUs per pod, the right
// pod headless, the rendezvous and engine Services selecting the right pods, in apply order),
// agreement with `afd topology`, the YAML form, refusals by name, and validation against the
// Kubernetes OpenAPI schemas (npm's kubernetes-models, offline).
#include "afd/deploy/k8s_manifests.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "afd/common/error.h"

namespace afd::deploy {
namespace {

using ojson = nlohmann::ordered_json;

struct Ran {
  int status;
  std::string out;
};
Ran Shell(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), pipe)) > 0;) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

K8sOptions Layout(const std::string& topology, int attention_pods, int ffn_pods, int tp) {
  K8sOptions o;
  o.topology = topology;
  o.attention_pods = attention_pods;
  o.ffn_pods = ffn_pods;
  o.attention_tp = tp;
  o.model = "/models/DeepSeek-V2-Lite";
  o.image = "registry.example/afd:1";
  return o;
}

// The value after `flag` in a command, or "".
std::string Flag(const ojson& command, const std::string& flag) {
  for (size_t i = 0; i + 1 < command.size(); ++i) {
    if (command[i] == flag) return command[i + 1].get<std::string>();
  }
  return "";
}
bool Has(const ojson& command, const std::string& flag) {
  for (const auto& c : command) {
    if (c == flag) return true;
  }
  return false;
}

TEST(K8sManifests, LayoutCoversEveryRankOnce) {
  for (const auto& [topology, pa, pf, tp] : std::vector<std::tuple<std::string, int, int, int>>{
           {"4A2F", 2, 1, 1}, {"8A4F", 2, 2, 2}, {"3A1F", 3, 1, 1}, {"2A2F", 1, 1, 2}}) {
    SCOPED_TRACE(topology);
    const auto objects = K8sManifests(Layout(topology, pa, pf, tp));
    const int A = std::stoi(topology), F = std::stoi(topology.substr(topology.find('A') + 1));
    // Services first (apply order), the store's selecting FFN pod 0.
    ASSERT_EQ(objects[0]["kind"], "Service");
    EXPECT_EQ(objects[0]["spec"]["clusterIP"], "None");
    EXPECT_EQ(objects[0]["spec"]["publishNotReadyAddresses"], true);
    EXPECT_EQ(objects[0]["spec"]["selector"]["afd/pod"], "afd-ffn-0");
    std::set<int> attention_ranks, ffn_ranks;
    int pods = 0, services = 0, api_pods = 0;
    bool pod_seen = false;
    for (const auto& obj : objects) {
      if (obj["kind"] == "Service") {
        EXPECT_FALSE(pod_seen) << "a Service after a Pod";
        ++services;
        continue;
      }
      pod_seen = true;
      ++pods;
      const ojson& c = obj["spec"]["containers"][0];
      const ojson& cmd = c["command"];
      const nlohmann::json cfg = nlohmann::json::parse(Flag(cmd, "--additional-config"));
      EXPECT_EQ(cfg["afd"]["num_attention_ranks"], A);
      EXPECT_EQ(cfg["afd"]["num_ffn_ranks"], F);
      EXPECT_EQ(cfg["afd"]["host"], "afd-store");
      const int start = std::stoi(Flag(cmd, "--data-parallel-start-rank"));
      const int local = std::stoi(Flag(cmd, "--data-parallel-size-local"));
      const int rtp = std::stoi(Flag(cmd, "--tensor-parallel-size"));
      EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], local * rtp);
      EXPECT_EQ(c["env"][0]["valueFrom"]["secretKeyRef"]["name"], "afd-join-secret");
      std::set<int>& ranks = cfg["afd"]["role"] == "ffn" ? ffn_ranks : attention_ranks;
      for (int d = start; d < start + local; ++d) {
        for (int t = 0; t < rtp; ++t) EXPECT_TRUE(ranks.insert(d * rtp + t).second) << d;
      }
      const bool api = c.contains("readinessProbe") && c["readinessProbe"].contains("httpGet");
      api_pods += api ? 1 : 0;
      if (cfg["afd"]["role"] == "attention") {
        EXPECT_EQ(Has(cmd, "--headless"), !api) << obj.dump();
        if (pa > 1) {
          EXPECT_EQ(Flag(cmd, "--data-parallel-address"), api ? "0.0.0.0" : "afd-engine");
        }
      } else {
        EXPECT_EQ(Flag(cmd, "--ready-file"), "/tmp/afd-ready");
      }
    }
    EXPECT_EQ(pods, pa + pf);
    EXPECT_EQ(services, pa > 1 ? 3 : 2);
    EXPECT_EQ(api_pods, 1);
    EXPECT_EQ(static_cast<int>(attention_ranks.size()), A);
    EXPECT_EQ(static_cast<int>(ffn_ranks.size()), F);
    EXPECT_EQ(*attention_ranks.rbegin(), A - 1);
    EXPECT_EQ(*ffn_ranks.rbegin(), F - 1);
  }
}

TEST(K8sManifests, GpusPerPodSharedRoundRobin) {
  K8sOptions o = Layout("4A2F", 1, 1, 1);
  o.gpus_per_pod = 2;
  for (const auto& obj : K8sManifests(o)) {
    if (obj["kind"] != "Pod" || obj["metadata"]["labels"]["afd/role"] != "attention") continue;
    const ojson& c = obj["spec"]["containers"][0];
    EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], 2);
    EXPECT_EQ(Flag(c["command"], "--cuda-devices"), "0,1,0,1");
  }
}

TEST(K8sManifests, RefusesLayoutsThatDoNotDivide) {
  auto refused = [](K8sOptions o, const std::string& want) {
    try {
      K8sManifests(o);
      ADD_FAILURE() << "accepted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(Layout("4A2F", 3, 1, 1), "--attention-pods 3 does not divide the 4 attention DP");
  refused(Layout("4A3F", 1, 2, 1), "--ffn-pods 2 does not divide the 3 FFN ranks");
  refused(Layout("3A1F", 1, 1, 2), "--attention-tp 2 does not divide the 3 attention ranks");
  refused(Layout("4x2", 1, 1, 1), "expected xAyF");
  K8sOptions bad = Layout("2A1F", 1, 1, 1);
  bad.name = "Bad_Name";
  refused(bad, "--name \"Bad_Name\": a DNS-1123 label");
  bad = Layout("2A1F", 1, 1, 1);
  bad.image.clear();
  refused(bad, "--image is required");
}

TEST(K8sManifests, YamlIsTheSameObjects) {
  const auto objects = K8sManifests(Layout("4A2F", 2, 1, 1));
  const std::string yaml = ToYaml(objects);
  EXPECT_NE(yaml.find("---\n"), std::string::npos);
  EXPECT_NE(yaml.find("  clusterIP: \"None\"\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("nvidia.com/gpu: 2"), std::string::npos) << yaml;  // a plain key
  if (Shell("python3 -c 'import yaml'").status != 0) GTEST_SKIP() << "PyYAML missing";
  const std::string file = ::testing::TempDir() + "/k8s_" + std::to_string(getpid());
  std::ofstream(file + ".yaml") << yaml;
  std::ofstream json(file + ".json");
  for (const auto& o : objects) json << o.dump() << "\n";
  json.close();
  const Ran r = Shell("python3 -c 'import json, sys, yaml; a = list(yaml.safe_load_all(open(\"" +
                      file + ".yaml\"))); b = [json.loads(l) for l in open(\"" + file +
                      ".json\")]; sys.exit(0 if a == b else 1)'");
  EXPECT_EQ(r.status, 0) << r.out;
}

// The generated objects validate against the Kubernetes OpenAPI schemas; a broken one does not.
TEST(K8sManifests, ValidateAgainstTheKubernetesSchemas) {
  const std::string modules = std::string(AFD_SOURCE_DIR) + "/.cache/npm/node_modules";
  if (Shell("node --version").status != 0 ||
      !std::filesystem::exists(modules + "/kubernetes-models/package.json")) {
    GTEST_SKIP() << "node or kubernetes-models missing (scripts/setup_tokenizer_data.sh)";
  }
  // Next to node_modules, so that its imports resolve.
  const std::string script = std::string(AFD_SOURCE_DIR) + "/.cache/npm/validate_k8s_test.mjs";
  std::filesystem::copy_file(std::string(AFD_SOURCE_DIR) + "/tests/deploy/validate_k8s.mjs", script,
                             std::filesystem::copy_options::overwrite_existing);
  for (const std::string args : {"--topology 4A2F --attention-pods 2",
                                 "--topology 8A4F --attention-pods 2 --ffn-pods 2 "
                                 "--attention-tp 2 --extra-flag=--max-num-seqs "
                                 "--extra-flag=128",
                                 "--topology 3A1F --device cpu --name demo --namespace serving"}) {
    const Ran r = Shell(std::string(AFD_BINARY) + " k8s " + args +
                        " --model /m --image registry.example/afd:1 --json | node " + script);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("ok Pod"), std::string::npos) << r.out;
  }
  const Ran bad = Shell(
      "echo '{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\"},"
      "\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":3}]}}' | node " +
      script);
  EXPECT_NE(bad.status, 0) << bad.out;
  EXPECT_NE(bad.out.find("invalid Pod p"), std::string::npos) << bad.out;
}

// The pods' ranks are those of `afd topology` for the same counts.
TEST(K8sManifests, RanksAgreeWithAfdTopology) {
  const Ran t = Shell(std::string(AFD_BINARY) + " topology --attention 4 --ffn 2 --json");
  ASSERT_EQ(t.status, 0) << t.out;
  const nlohmann::json topo = nlohmann::json::parse(t.out);
  int attention = 0, ffn = 0;
  for (const auto& r : topo["world"]) (r["role"] == "ffn" ? ffn : attention) += 1;
  int a_ranks = 0, f_ranks = 0;
  for (const auto& obj : K8sManifests(Layout("4A2F", 2, 1, 1))) {
    if (obj["kind"] != "Pod") continue;
    const ojson& cmd = obj["spec"]["containers"][0]["command"];
    const int n = std::stoi(Flag(cmd, "--data-parallel-size-local")) *
                  std::stoi(Flag(cmd, "--tensor-parallel-size"));
    (obj["metadata"]["labels"]["afd/role"] == "ffn" ? f_ranks : a_ranks) += n;
  }
  EXPECT_EQ(a_ranks, attention);
  EXPECT_EQ(f_ranks, ffn);
  const Ran bad = Shell(std::string(AFD_BINARY) +
                        " k8s --topology 4A2F --attention-pods 3 --model "
                        "/m --image i");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("afd k8s: --attention-pods 3 does not divide"), std::string::npos)
      << bad.out;
}

}  // namespace
}  // namespace afd::deploy

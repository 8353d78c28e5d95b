#include "afd/deploy/k8s_manifests.h"

#include <fmt/format.h>

#include <regex>

#include "afd/common/error.h"

namespace afd::deploy {

using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kReadyFile = "/tmp/afd-ready";

bool IsDnsLabel(const std::string& s) {
  static const std::regex label("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
  return s.size() <= 40 && std::regex_match(s, label);
}

ojson Metadata(const K8sOptions& o, const std::string& name, const ojson& labels) {
  return {{"name", name}, {"namespace", o.namespace_}, {"labels", labels}};
}

ojson HeadlessService(const K8sOptions& o, const std::string& name, const std::string& pod,
                      int port, const std::string& port_name) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata", Metadata(o, name, {{"app", o.name}})},
      {"spec",
       {{"clusterIP", "None"},
        {"publishNotReadyAddresses", true},
        {"selector", {{"afd/pod", pod}}},
        {"ports", ojson::array({{{"name", port_name}, {"port", port}, {"protocol", "TCP"}}})}}}};
}

}  // namespace

void K8sOptions::Validate() const {
  AFD_CHECK(IsDnsLabel(name),
            "--name \"{}\": a DNS-1123 label of at most 40 characters "
            "(lower case letters, digits, '-')",
            name);
  AFD_CHECK(IsDnsLabel(namespace_), "--namespace \"{}\": a DNS-1123 label", namespace_);
  AFD_CHECK(!model.empty(), "--model is required (the model's path inside the image)");
  AFD_CHECK(!image.empty(), "--image is required (the container image holding afd)");
  AFD_CHECK(device == "cuda" || device == "cpu", "--device {}: cuda or cpu", device);
  AFD_CHECK(attention_pods >= 1 && ffn_pods >= 1 && attention_tp >= 1,
            "--attention-pods, --ffn-pods and --attention-tp must be positive");
  AFD_CHECK(gpus_per_pod >= 0, "--gpus-per-pod {} is negative", gpus_per_pod);
  AFD_CHECK(gpus_per_pod == 0 || device == "cuda", "--gpus-per-pod needs --device cuda");
  for (int p : {store_port, rpc_port, api_port}) {
    AFD_CHECK(p >= 1 && p <= 65535, "port {} is not in 1..65535", p);
  }
  AFD_CHECK(!secret_name.empty(), "--secret-name is empty");
}

std::vector<ojson> K8sManifests(const K8sOptions& o) {
  o.Validate();
  std::smatch m;
  static const std::regex shape("^([0-9]+)A([0-9]+)F$", std::regex::icase);
  AFD_CHECK(std::regex_match(o.topology, m, shape), "--topology \"{}\": expected xAyF, e.g. 4A2F",
            o.topology);
  const int A = std::stoi(m[1]), F = std::stoi(m[2]);
  AFD_CHECK(A >= 1 && F >= 1, "--topology {}: rank counts must be positive", o.topology);
  AFD_CHECK(A % o.attention_tp == 0, "--attention-tp {} does not divide the {} attention ranks",
            o.attention_tp, A);
  const int dp_a = A / o.attention_tp;
  AFD_CHECK(dp_a % o.attention_pods == 0,
            "--attention-pods {} does not divide the {} attention DP replicas ({} ranks / TP {})",
            o.attention_pods, dp_a, A, o.attention_tp);
  AFD_CHECK(F % o.ffn_pods == 0, "--ffn-pods {} does not divide the {} FFN ranks", o.ffn_pods, F);
  const int local_a = dp_a / o.attention_pods, local_f = F / o.ffn_pods;
  const bool cuda = o.device == "cuda";
  const std::string connector = !o.connector.empty() ? o.connector
                                : cuda               ? "P2pNcclAFDConnector"
                                                     : "P2pHostAFDConnector";
  const std::string store = o.name + "-store";
  const std::string engine = o.name + "-engine";
  const std::string api_pod = o.name + "-attention-0";
  auto config = [&](const char* role) {
    return nlohmann::json{{"afd",
                           {{"role", role},
                            {"connector", connector},
                            {"host", store},
                            {"port", o.store_port},
                            {"num_attention_ranks", A},
                            {"num_ffn_ranks", F}}}}
        .dump();
  };

  std::vector<ojson> out;
  out.push_back(HeadlessService(o, store, o.name + "-ffn-0", o.store_port, "rendezvous"));
  if (o.attention_pods > 1) {
    out.push_back(HeadlessService(o, engine, api_pod, o.rpc_port, "engine"));
  }
  out.push_back({{"apiVersion", "v1"},
                 {"kind", "Service"},
                 {"metadata", Metadata(o, o.name, {{"app", o.name}})},
                 {"spec",
                  {{"type", "ClusterIP"},
                   {"selector", {{"afd/pod", api_pod}}},
                   {"ports", ojson::array({{{"name", "http"},
                                            {"port", o.api_port},
                                            {"targetPort", o.api_port},
                                            {"protocol", "TCP"}}})}}}});

  auto pod = [&](const std::string& role, int index, int gpus, std::vector<std::string> args,
                 bool api) {
    const std::string name = fmt::format("{}-{}-{}", o.name, role, index);
    std::vector<std::string> command = {o.afd_binary, "serve", o.model, "--device", o.device};
    command.insert(command.end(), args.begin(), args.end());
    const int ranks = gpus;  // one GPU per rank unless --gpus-per-pod says otherwise
    if (o.gpus_per_pod > 0) gpus = o.gpus_per_pod;
    if (cuda && ranks > 1) {
      std::string devices;
      for (int r = 0; r < ranks; ++r) {
        if (r > 0) devices += ',';
        devices += std::to_string(r % gpus);
      }
      command.insert(command.end(), {"--cuda-devices", devices});
    }
    if (!api) command.insert(command.end(), {"--ready-file", kReadyFile});
    command.insert(command.end(), o.extra_flags.begin(), o.extra_flags.end());
    ojson container = {
        {"name", "afd"},
        {"image", o.image},
        {"command", command},
        {"env",
         ojson::array(
             {{{"name", "AFD_JOIN_SECRET"},
               {"valueFrom", {{"secretKeyRef", {{"name", o.secret_name}, {"key", "secret"}}}}}}})},
        {"volumeMounts", ojson::array({{{"name", "dshm"}, {"mountPath", "/dev/shm"}}})}};
    ojson ports = ojson::array();
    if (role == "ffn" && index == 0) {
      ports.push_back({{"name", "rendezvous"}, {"containerPort", o.store_port}});
    }
    if (api) {
      ports.push_back({{"name", "http"}, {"containerPort", o.api_port}});
      if (o.attention_pods > 1)
        ports.push_back({{"name", "engine"}, {"containerPort", o.rpc_port}});
      container["readinessProbe"] = {{"httpGet", {{"path", "/health"}, {"port", o.api_port}}},
                                     {"periodSeconds", 5},
                                     {"failureThreshold", 3}};
    } else {
      container["readinessProbe"] = {{"exec", {{"command", {"test", "-e", kReadyFile}}}},
                                     {"periodSeconds", 5}};
    }
    if (!ports.empty()) container["ports"] = ports;
    if (cuda) {
      container["resources"] = {{"limits", {{"nvidia.com/gpu", gpus}}}};
    }
    return ojson{
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", Metadata(o, name, {{"app", o.name}, {"afd/role", role}, {"afd/pod", name}})},
        {"spec",
         {{"restartPolicy", "Never"},
          {"terminationGracePeriodSeconds", 60},
          {"containers", ojson::array({container})},
          {"volumes",
           ojson::array({{{"name", "dshm"},
                          {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", o.shm_size}}}}})}}}};
  };

  for (int j = 0; j < o.ffn_pods; ++j) {
    out.push_back(pod("ffn", j, local_f,
                      {"--data-parallel-size", std::to_string(F), "--data-parallel-size-local",
                       std::to_string(local_f), "--data-parallel-start-rank",
                       std::to_string(j * local_f), "--tensor-parallel-size", "1",
                       "--enable-expert-parallel", "--additional-config", config("ffn")},
                      false));
  }
  for (int i = 0; i < o.attention_pods; ++i) {
    std::vector<std::string> args = {"--data-parallel-size",       std::to_string(dp_a),
                                     "--data-parallel-size-local", std::to_string(local_a),
                                     "--data-parallel-start-rank", std::to_string(i * local_a),
                                     "--tensor-parallel-size",     std::to_string(o.attention_tp),
                                     "--additional-config",        config("attention")};
    if (o.attention_pods > 1) {
      args.insert(args.end(), {"--data-parallel-address", i == 0 ? "0.0.0.0" : engine,
                               "--data-parallel-rpc-port", std::to_string(o.rpc_port)});
    }
    if (i == 0) {
      args.insert(args.end(), {"--host", "0.0.0.0", "--port", std::to_string(o.api_port)});
    } else {
      args.push_back("--headless");
    }
    out.push_back(pod("attention", i, local_a * o.attention_tp, args, i == 0));
  }
  return out;
}

namespace {

void Emit(const ojson& v, int indent, std::string& out);

std::string Scalar(const ojson& v) {
  if (v.is_string()) return v.dump();  // a JSON string is a YAML double-quoted scalar
  if (v.is_null()) return "null";
  return v.dump();
}

// A plain key where YAML reads it as that string (apiVersion, afd/pod, nvidia.com/gpu), else
// double-quoted.
std::string Key(const std::string& k) {
  static const std::regex plain("^[A-Za-z_][A-Za-z0-9_./-]*$");
  return std::regex_match(k, plain) ? k : nlohmann::json(k).dump();
}

bool IsEmptyCollection(const ojson& v) { return (v.is_object() || v.is_array()) && v.empty(); }

void Emit(const ojson& v, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += pad + Key(it.key()) + ":";
      const ojson& c = it.value();
      if ((c.is_object() || c.is_array()) && !c.empty()) {
        out += "\n";
        Emit(c, indent + 2, out);
      } else {
        out += ' ';
        out += IsEmptyCollection(c) ? c.dump() : Scalar(c);
        out += '\n';
      }
    }
  } else if (v.is_array()) {
    for (const ojson& c : v) {
      if ((c.is_object() || c.is_array()) && !c.empty()) {
        // "- " then the collection's first line on the same line, the rest indented under it.
        std::string inner;
        Emit(c, indent + 2, inner);
        out += pad + "- " + inner.substr(static_cast<size_t>(indent + 2));
      } else {
        out += pad + "- " + (IsEmptyCollection(c) ? c.dump() : Scalar(c)) + "\n";
      }
    }
  }
}

}  // namespace

std::string ToYaml(const std::vector<ojson>& objects) {
  std::string out;
  for (size_t i = 0; i < objects.size(); ++i) {
    if (i > 0) out += "---\n";
    Emit(objects[i], 0, out);
  }
  return out;
}

}  // namespace afd::deploy

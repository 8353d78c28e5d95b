// `afd k8s`: the Kubernetes manifests of a multi-pod deployment (deploy/k8s_manifests.h), on
// stdout as YAML (or JSON with --json), for `kubectl apply -f -`.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "afd/cli/commands.h"
#include "afd/cli/validators.h"
#include "afd/common/error.h"
#include "afd/deploy/k8s_manifests.h"

namespace afd::cli {

void AddK8sCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<deploy::K8sOptions>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "k8s",
      "Print the Kubernetes manifests of a multi-pod AFD deployment (Services, then one Pod per "
      "pod; docs/deploy.md): kubectl create secret generic afd-join-secret "
      "--from-literal=secret=$(openssl rand -hex 32); afd k8s ... | kubectl apply -f -");
  cmd->add_option("--topology", o->topology, "xAyF: attention and FFN rank counts")->required();
  cmd->add_option("--model", o->model, "The model's path inside the image (or preset:NAME)")
      ->required();
  cmd->add_option("--image", o->image, "The container image holding afd")->required();
  cmd->add_option("--attention-pods", o->attention_pods,
                  "Pods of the attention role (pod 0 answers the API; the others are headless)")
      ->check(Positive());
  cmd->add_option("--ffn-pods", o->ffn_pods, "Pods of the FFN role")->check(Positive());
  cmd->add_option("--attention-tp", o->attention_tp, "Tensor-parallel size of a replica")
      ->check(Positive());
  cmd->add_option("--gpus-per-pod", o->gpus_per_pod,
                  "GPUs each pod requests (default: one per rank; fewer: its ranks share them, "
                  "with MPS)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--name", o->name, "Prefix of every object (default afd)");
  cmd->add_option("--namespace", o->namespace_, "Namespace (default default)");
  cmd->add_option("--afd-binary", o->afd_binary, "The afd executable in the image (default afd)");
  cmd->add_option("--device", o->device, "cuda (GPUs requested per pod) or cpu")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--connector", o->connector,
                  "AFD connector (default P2pNcclAFDConnector on cuda, P2pHostAFDConnector on "
                  "cpu)");
  cmd->add_option("--secret-name", o->secret_name,
                  "Secret holding the join secret under key \"secret\" (default afd-join-secret)");
  cmd->add_option("--store-port", o->store_port, "Rendezvous store port (default 6269)");
  cmd->add_option("--rpc-port", o->rpc_port, "The API pod's engine listener (default 13345)");
  cmd->add_option("--api-port", o->api_port, "OpenAI API port (default 8000)");
  cmd->add_option("--shm-size", o->shm_size, "Size of each pod's /dev/shm (default 16Gi)");
  cmd->add_option("--extra-flag", o->extra_flags,
                  "A flag for every pod's `afd serve` (repeat; e.g. --extra-flag=--max-num-seqs "
                  "--extra-flag=256)")
      ->allow_extra_args(false);
  cmd->add_flag("--json", *json, "JSON (one object per line) instead of YAML");
  cmd->callback([o, json, &exit_code] {
    std::vector<nlohmann::ordered_json> objects;
    try {
      objects = deploy::K8sManifests(*o);
    } catch (const Error& e) {
      std::cerr << "afd k8s: " << e.what() << std::endl;
      exit_code = 2;
      return;
    }
    if (*json) {
      for (const auto& obj : objects) std::cout << obj.dump() << "\n";
    } else {
      std::cout << deploy::ToYaml(objects);
    }
    exit_code = 0;
  });
}

}  // namespace afd::cli

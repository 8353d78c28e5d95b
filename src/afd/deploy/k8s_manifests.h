// Kubernetes manifests of a multi-pod AFD deployment (`afd k8s`), the deployment topologies'
// layout: one role per pod, attention DP spread over attention pods (pod 0 answers the OpenAI API
// and listens for the others' replicas; the rest are headless), FFN DP spread over FFN pods (FFN
// rank 0, in pod 0, serves the rendezvous store). docs/deploy.md explains each object.
//
// Objects, in the order they must be applied (Services first: with publishNotReadyAddresses
// their DNS names resolve before any pod is ready, so the ranks can rendezvous before their
// readiness): a headless Service for the store (FFN pod 0), one for the API pod's engine listener
// (when there are several attention pods), a ClusterIP Service for clients, then one Pod per pod,
// each with its GPUs, a /dev/shm of shm_size, the join secret from a Secret (key "secret"), and
// a readiness probe: GET /health on the API pod, `--ready-file` elsewhere.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace afd::deploy {

struct K8sOptions {
  std::string name = "afd";  // prefix of every object, a DNS-1123 label
  std::string namespace_ = "default";
  std::string topology;  // xAyF
  int attention_pods = 1;
  int ffn_pods = 1;
  int attention_tp = 1;
  // GPUs a pod requests; 0: one per rank of the pod. Fewer than its ranks: the ranks share them
  // round-robin (--cuda-devices; start MPS in the image for several ranks on one GPU).
  int gpus_per_pod = 0;
  std::string model;  // the model path inside the image (or preset:NAME)
  std::string image;
  std::string afd_binary = "afd";  // the afd executable inside the image
  std::string device = "cuda";     // cuda (GPUs requested per pod) or cpu
  std::string connector;           // "": P2pNcclAFDConnector on cuda, P2pHostAFDConnector on cpu
  std::string secret_name = "afd-join-secret";
  int store_port = 6269;
  int rpc_port = 13345;
  int api_port = 8000;
  std::string shm_size = "16Gi";
  std::vector<std::string> extra_flags;  // appended to every pod's command (engine flags...)
  // Throws afd::Error naming the field.
  void Validate() const;
};

// The objects, in apply order. Throws afd::Error naming the field for a layout that does not
// divide (attention DP over attention pods, FFN ranks over FFN pods, ranks over TP).
std::vector<nlohmann::ordered_json> K8sManifests(const K8sOptions& options);

// Multi-document YAML ("---" between objects); every string double-quoted.
std::string ToYaml(const std::vector<nlohmann::ordered_json>& objects);

}  // namespace afd::deploy

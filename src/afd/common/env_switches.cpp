#include "afd/common/env_switches.h"

#include <array>
#include <cstdlib>

#include "afd/common/error.h"

namespace afd {

namespace {

// Sorted by name (EnvSwitches' contract; the test checks it). The CUDA kernel switches choose
// among forms of one op for measurements (tools/device/switch_ab.sh runs an op both ways);
// docs/architecture.md says which form runs when.
constexpr std::array kSwitches = {
    EnvSwitch{"AFD_CPU_GEMM", "portable, avx2 or avx512", "the best kernel this CPU runs",
              "caps the CPU GEMM kernel (every cap gives the same bits)"},
    EnvSwitch{"AFD_DEBUG", "any value", "errors say what failed only",
              "an error also says where in the source it was raised"},
    EnvSwitch{"AFD_FP8_EXPERTS", "0 or 1", "FP8 routed experts dequantized on load (bf16 on a GPU)",
              "1: held as FP8 on a GPU (sm_89+): w8a8 on the e4m3 tensor cores at decode sizes, "
              "dequantized to bf16 for prefill"},
    EnvSwitch{"AFD_GEMV_F32_CHUNKS", "0", "fp32 GEMV of 9-16 rows in row chunks",
              "0: cuBLAS for those rows instead"},
    EnvSwitch{"AFD_JOIN_SECRET", "a secret of >= 16 bytes", "loopback deployments only",
              "the secret every rank of a deployment and its store authenticate with"},
    EnvSwitch{"AFD_JOIN_SECRET_FILE", "a path", "see AFD_JOIN_SECRET",
              "a file (its owner's alone) holding the join secret"},
    EnvSwitch{"AFD_LINEAR_TILED", "0", "the tiled Linear kernel where it fits",
              "0: cuBLAS instead"},
    EnvSwitch{"AFD_MLA_PREFILL", "0", "the expanded MLA prefill where it fits",
              "0: the absorbed form instead"},
    EnvSwitch{"AFD_MLA_TILES", "0", "the tiled MLA decode kernel where it fits",
              "0: the chunked kernel instead"},
    EnvSwitch{"AFD_MLA_WG", "0 or 1", "AttentionWg where blocks walk >= 8 tiles (sm_90a)",
              "0: never; 1: wherever it can run"},
    EnvSwitch{"AFD_MOE_WGMMA", "0", "GroupedTiled on wgmma (sm_90a code)", "0: mma.sync instead"},
    EnvSwitch{"AFD_NCCL_SKIP_SHARED_GPU_CHECK", "1", "two NCCL ranks on one GPU are refused",
              "1: let NCCL meet them itself (to see how it reports it)"},
    EnvSwitch{"AFD_PDL", "0", "programmatic dependent launch for steps of <= 64 rows",
              "0: plain launches"},
    EnvSwitch{"AFD_ROUTER_FUSED", "0", "router gate + top-k in one kernel where it fits",
              "0: Linear, then RouterTopk"},
    EnvSwitch{"AFD_ROUTER_PERMUTE", "0", "router, top-k and MoePermute in one op where it fits",
              "0: RouterGateTopk, then MoePermute"},
    EnvSwitch{"AFD_ROUTER_ROWS", "0", "the fused router's 65-511-token form",
              "0: Linear, then RouterTopk from 65 tokens on"},
    EnvSwitch{"AFD_SIDE_STREAM", "0", "shared experts on a second stream (steps of <= 1024 rows)",
              "0: one stream"},
};

const EnvSwitch* Find(std::string_view name) {
  for (const EnvSwitch& s : kSwitches) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

}  // namespace

std::span<const EnvSwitch> EnvSwitches() { return kSwitches; }

std::optional<std::string> EnvValue(std::string_view name) {
  const EnvSwitch* s = Find(name);
  AFD_CHECK(s != nullptr,
            "environment variable {} is not in afd's registry (src/afd/common/env_switches.cpp)",
            name);
  const char* v = std::getenv(s->name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

bool EnvOff(std::string_view name) { return EnvValue(name) == "0"; }

int64_t EnvCount(std::string_view name, int64_t max) {
  const std::optional<std::string> v = EnvValue(name);
  if (!v || v->empty()) return 0;
  char* end = nullptr;
  const long long c = std::strtoll(v->c_str(), &end, 10);
  AFD_CHECK(*end == '\0' && c >= 1 && c <= max, "{}={}: expected a whole number from 1 to {}", name,
            *v, max);
  return c;
}

std::string EnvSwitchesHelp() {
  std::string out =
      "afd's environment variables (NAME=what it takes; unset: the default; then what it "
      "does):\n";
  for (const EnvSwitch& s : kSwitches) {
    out += fmt::format("  {}={}\n      unset: {}; {}\n", s.name, s.values, s.unset, s.meaning);
  }
  return out;
}

}  // namespace afd

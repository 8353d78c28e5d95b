// Replays every fuzz corpus seed (fuzz/corpus/<target>/) and every input a fuzzer once crashed
// on (tests/fuzz_regressions/<target>/) through the fuzz entry points, in the ordinary build --
// so a fixed crash stays fixed under `make test` and `make test-asan`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "fuzz/fuzz_targets.h"

namespace afd::fuzz {
namespace {

namespace fs = std::filesystem;

const std::map<std::string, std::function<void(const uint8_t*, size_t)>>& Targets() {
  static const std::map<std::string, std::function<void(const uint8_t*, size_t)>> targets = {
      {"afd_config", AfdConfigInput},         {"model_config", ModelConfigInput},
      {"safetensors", SafetensorsInput},      {"safetensors_index", SafetensorsIndexInput},
      {"wire_headers", WireHeadersInput},     {"store_protocol", StoreProtocolInput},
      {"engine_message", EngineMessageInput},
  };
  return targets;
}

int Replay(const fs::path& root) {
  int files = 0;
  if (!fs::is_directory(root)) return 0;
  for (const auto& dir : fs::directory_iterator(root)) {
    if (!dir.is_directory()) continue;
    const auto it = Targets().find(dir.path().filename().string());
    EXPECT_NE(it, Targets().end()) << "no fuzz target named " << dir.path();
    if (it == Targets().end()) continue;
    for (const auto& file : fs::directory_iterator(dir.path())) {
      std::ifstream in(file.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string bytes = ss.str();
      SCOPED_TRACE(file.path().string());
      it->second(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++files;
    }
  }
  return files;
}

TEST(FuzzRegressions, CorpusSeedsAndPastCrashesAreHandled) {
  EXPECT_GE(Replay(fs::path(AFD_SOURCE_DIR) / "fuzz" / "corpus"), 6);
  Replay(fs::path(AFD_SOURCE_DIR) / "tests" / "fuzz_regressions");
}

TEST(FuzzRegressions, EveryTargetHasSeeds) {
  for (const auto& [name, fn] : Targets()) {
    EXPECT_TRUE(fs::is_directory(fs::path(AFD_SOURCE_DIR) / "fuzz" / "corpus" / name)) << name;
  }
}

}  // namespace
}  // namespace afd::fuzz

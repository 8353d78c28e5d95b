// Rules of the source tree the layered build alone does not enforce.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace afd {
namespace {

// Only the kernels layer knows its backends: everything above it reaches them through
// kernels/backend.h (Backend, MakeBackend), so no file outside src/afd/kernels includes a file
// of kernels/cpu or kernels/cuda.
TEST(SourceRules, BackendsAreReachedThroughTheBackendInterface) {
  const std::filesystem::path src = std::filesystem::path(AFD_SOURCE_DIR) / "src/afd";
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::filesystem::path rel = std::filesystem::relative(entry.path(), src);
    if (*rel.begin() == "kernels") continue;
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.rfind("#include", 0) != 0) continue;
      EXPECT_EQ(line.find("afd/kernels/cpu/"), std::string::npos)
          << rel << ":" << n << ": " << line;
      EXPECT_EQ(line.find("afd/kernels/cuda/"), std::string::npos)
          << rel << ":" << n << ": " << line;
    }
  }
  EXPECT_GT(files, 100);
}

// The text layer (tokenizer, chat templates) and the bench client sit on common alone.
TEST(SourceRules, TextAndTheBenchClientNeedOnlyCommon) {
  for (const std::string layer : {"text", "bench_client"}) {
    const std::filesystem::path dir = std::filesystem::path(AFD_SOURCE_DIR) / "src/afd" / layer;
    int files = 0;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      ++files;
      std::ifstream in(entry.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        if (line.rfind("#include \"afd/", 0) != 0) continue;
        const bool ok = line.rfind("#include \"afd/common/", 0) == 0 ||
                        line.rfind("#include \"afd/" + layer + "/", 0) == 0;
        EXPECT_TRUE(ok) << entry.path() << ":" << n << ": " << line;
      }
    }
    EXPECT_GT(files, 10) << layer;
  }
}

}  // namespace
}  // namespace afd

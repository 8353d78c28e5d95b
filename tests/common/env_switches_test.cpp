// The registry of environment variables: well formed, documented, and the only reader.
#include "afd/common/env_switches.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "afd/common/error.h"
#include "testing/files.h"

namespace afd {
namespace {

using testing_util::ReadFile;

TEST(EnvSwitches, SortedUniqueAndComplete) {
  std::string last;
  for (const EnvSwitch& s : EnvSwitches()) {
    const std::string name = s.name;
    EXPECT_EQ(name.rfind("AFD_", 0), 0u) << name;
    EXPECT_LT(last, name) << "not sorted or repeated";
    EXPECT_NE(std::string(s.values), "") << name;
    EXPECT_NE(std::string(s.unset), "") << name;
    EXPECT_NE(std::string(s.meaning), "") << name;
    last = name;
  }
}

TEST(EnvSwitches, ReadsOnlyRegisteredNames) {
  EXPECT_THROW(EnvValue("AFD_NO_SUCH_SWITCH"), Error);
  ::unsetenv("AFD_MLA_WG");
  EXPECT_EQ(EnvValue("AFD_MLA_WG"), std::nullopt);
  EXPECT_EQ(EnvCount("AFD_MLA_WG", 64), 0);
  ::setenv("AFD_MLA_WG", "7", 1);
  EXPECT_EQ(EnvCount("AFD_MLA_WG", 64), 7);
  EXPECT_FALSE(EnvOff("AFD_MLA_WG"));
  for (const char* bad : {"0", "65", "3x", "-1"}) {
    ::setenv("AFD_MLA_WG", bad, 1);
    try {
      EnvCount("AFD_MLA_WG", 64);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("AFD_MLA_WG"), std::string::npos) << e.what();
    }
  }
  ::setenv("AFD_MLA_WG", "", 1);
  EXPECT_EQ(EnvCount("AFD_MLA_WG", 64), 0);  // empty: as unset
  ::unsetenv("AFD_MLA_WG");
  ::setenv("AFD_PDL", "0", 1);
  EXPECT_TRUE(EnvOff("AFD_PDL"));
  ::unsetenv("AFD_PDL");
  EXPECT_FALSE(EnvOff("AFD_PDL"));
}

TEST(EnvSwitches, HelpAndDocsListEveryOne) {
  const std::string help = EnvSwitchesHelp();
  const std::string docs =
      ReadFile((std::filesystem::path(AFD_SOURCE_DIR) / "docs/config.md").string());
  ASSERT_FALSE(docs.empty());
  for (const EnvSwitch& s : EnvSwitches()) {
    EXPECT_NE(help.find(std::string(s.name) + "="), std::string::npos) << s.name;
    EXPECT_NE(docs.find(std::string("| `") + s.name + "` |"), std::string::npos)
        << s.name << " is not in docs/config.md's table";
  }
}

// No source file reads the environment but the registry, and every AFD_* name the code asks
// the registry (or the CUDA backend's ChoiceOff / ChoiceCount) for is registered.
TEST(EnvSwitches, TheRegistryIsTheOnlyReader) {
  std::set<std::string> registered;
  for (const EnvSwitch& s : EnvSwitches()) registered.insert(s.name);
  const std::regex read(
      R"re((?:EnvValue|EnvOff|EnvCount|ChoiceOff|ChoiceCount)\("(AFD_[A-Z0-9_]+)")re");
  std::set<std::string> named;  // registered names that appear in the code as literals
  int files = 0, reads = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(
           std::filesystem::path(AFD_SOURCE_DIR) / "src")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
    ++files;
    const std::string text = ReadFile(entry.path().string());
    if (entry.path().filename() != "env_switches.cpp") {
      EXPECT_EQ(text.find("getenv("), std::string::npos)
          << entry.path() << " reads the environment itself (use afd/common/env_switches.h)";
      for (const std::string& n : registered) {
        if (text.find('"' + n + '"') != std::string::npos) named.insert(n);
      }
    }
    for (std::sregex_iterator it(text.begin(), text.end(), read), end; it != end; ++it) {
      ++reads;
      EXPECT_TRUE(registered.count((*it)[1].str())) << entry.path() << ": " << (*it)[1].str();
    }
  }
  for (const std::string& n : registered) {
    EXPECT_TRUE(named.count(n)) << n << " is registered but no code reads it";
  }
  EXPECT_GT(files, 100);
  EXPECT_GT(reads, 15);
}

}  // namespace
}  // namespace afd

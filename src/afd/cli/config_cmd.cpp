#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "afd/cli/commands.h"
#include "afd/common/error.h"
#include "afd/config/afd_config.h"

namespace afd::cli {

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AFD_CHECK(in.good(), "--file {}: cannot open the file", path);
  std::ostringstream text;
  text << in.rdbuf();
  AFD_CHECK(!in.bad(), "--file {}: read failed", path);
  return text.str();
}

}  // namespace

void AddConfigCommand(CLI::App& app, int& exit_code) {
  auto* config = app.add_subcommand("config", "Work with AFD configuration");
  config->require_subcommand(1);
  auto* check = config->add_subcommand(
      "check",
      "Validate an AFD config (a bare afd object or a whole --additional-config with an \"afd\" "
      "key). Valid: prints the normalized config as JSON, exit 0. Invalid: prints the error, "
      "exit 2.");
  struct Args {
    std::string file;
    std::string json;
  };
  auto args = std::make_shared<Args>();
  auto* file_opt = check->add_option("--file", args->file, "Read the config from this file");
  auto* json_opt = check->add_option("json", args->json, "The config as JSON text");
  file_opt->excludes(json_opt);
  json_opt->excludes(file_opt);
  check->callback([args, file_opt, json_opt, &exit_code] {
    if (file_opt->count() == 0 && json_opt->count() == 0) {
      std::cerr << "afd config check: give the config as JSON text or with --file PATH\n";
      exit_code = 2;
      return;
    }
    try {
      const std::string text = file_opt->count() ? ReadFile(args->file) : args->json;
      const AfdConfig parsed = ParseAfdConfig(text);
      std::cout << AfdConfigToJson(parsed) << "\n";
      exit_code = 0;
    } catch (const Error& e) {
      std::cerr << "afd config check: invalid config: " << e.what() << "\n";
      exit_code = 2;
    }
  });
}

}  // namespace afd::cli

#include "afd/bench_client/bench_dataset.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "afd/common/error.h"

namespace afd::bench_client {

namespace {

// Uniform integer in [lo, hi] from one 64-bit draw (the same on every standard library).
int64_t Draw(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(rng() % span);
}

}  // namespace

std::vector<BenchPrompt> RandomDataset(const RandomDatasetOptions& o) {
  AFD_CHECK(o.num_prompts >= 1, "--num-prompts {}: must be at least 1", o.num_prompts);
  AFD_CHECK(o.input_len >= 1, "--random-input-len {}: must be at least 1", o.input_len);
  AFD_CHECK(o.output_len >= 1, "--random-output-len {}: must be at least 1", o.output_len);
  AFD_CHECK(o.range_ratio >= 0.0 && o.range_ratio < 1.0,
            "--random-range-ratio {}: must be in [0, 1)", o.range_ratio);
  AFD_CHECK(o.vocab_size >= 1, "--random-vocab-size {}: must be at least 1", o.vocab_size);
  const auto bounds = [&](int64_t len) {
    const auto lo =
        static_cast<int64_t>(std::floor(static_cast<double>(len) * (1 - o.range_ratio)));
    const auto hi = static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1 + o.range_ratio)));
    return std::pair<int64_t, int64_t>(std::max<int64_t>(lo, 1), std::max<int64_t>(hi, 1));
  };
  const auto [in_lo, in_hi] = bounds(o.input_len);
  const auto [out_lo, out_hi] = bounds(o.output_len);
  std::mt19937_64 rng(o.seed);
  std::vector<BenchPrompt> prompts(static_cast<size_t>(o.num_prompts));
  for (BenchPrompt& p : prompts) {
    p.ids.resize(static_cast<size_t>(Draw(rng, in_lo, in_hi)));
    p.output_len = Draw(rng, out_lo, out_hi);
    for (int64_t& id : p.ids) id = Draw(rng, 0, o.vocab_size - 1);
  }
  return prompts;
}

std::vector<BenchPrompt> LoadJsonlDataset(const std::string& path, int64_t num_prompts,
                                          int64_t default_output_len) {
  AFD_CHECK(num_prompts >= 1, "--num-prompts {}: must be at least 1", num_prompts);
  std::ifstream in(path);
  AFD_CHECK(in.good(), "--dataset {}: cannot open the file", path);
  std::vector<BenchPrompt> file_prompts;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      AFD_THROW("{}:{}: not JSON: {}", path, line_no, e.what());
    }
    AFD_CHECK(j.is_object() && j.contains("prompt"), "{}:{}: expected an object with \"prompt\"",
              path, line_no);
    BenchPrompt p;
    const nlohmann::json& prompt = j["prompt"];
    if (prompt.is_string()) {
      p.text = prompt.get<std::string>();
      p.is_text = true;
    } else {
      AFD_CHECK(prompt.is_array() && !prompt.empty(),
                "{}:{}: \"prompt\" must be a string or a non-empty array of token ids", path,
                line_no);
      for (const nlohmann::json& id : prompt) {
        AFD_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
                  "{}:{}: \"prompt\" has {}, not a token id", path, line_no, id.dump());
        p.ids.push_back(id.get<int64_t>());
      }
    }
    p.output_len = default_output_len;
    for (const char* key : {"output_len", "max_tokens"}) {
      if (!j.contains(key)) continue;
      AFD_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() >= 1,
                "{}:{}: \"{}\" must be a positive integer, not {}", path, line_no, key,
                j[key].dump());
      p.output_len = j[key].get<int64_t>();
      break;
    }
    AFD_CHECK(p.output_len >= 1, "{}:{}: no \"output_len\" and --random-output-len is {}", path,
              line_no, default_output_len);
    file_prompts.push_back(std::move(p));
  }
  AFD_CHECK(!file_prompts.empty(), "--dataset {}: no prompts in the file", path);
  std::vector<BenchPrompt> prompts;
  for (int64_t i = 0; i < num_prompts; ++i) {
    prompts.push_back(file_prompts[static_cast<size_t>(i) % file_prompts.size()]);
  }
  return prompts;
}

}  // namespace afd::bench_client

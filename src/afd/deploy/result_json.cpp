#include "afd/deploy/result_json.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace afd::deploy {

std::string ResultJsonLine(const runtime::GenerationResult& r) {
  nlohmann::ordered_json j;
  j["prompt_ids"] = r.prompt_ids;
  j["output_ids"] = r.output_ids;
  nlohmann::ordered_json plp = nlohmann::ordered_json::array();
  for (float v : r.prompt_logprobs) {
    plp.push_back(std::isnan(v) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v));
  }
  j["prompt_logprobs"] = plp;
  if (!r.prompt_top1.empty()) {
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    for (int32_t id : r.prompt_top1) {
      top.push_back(id < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(id));
    }
    j["prompt_top1"] = top;
  }
  j["logprobs"] = r.logprobs;
  return j.dump();
}

}  // namespace afd::deploy

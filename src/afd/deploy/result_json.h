// The JSON line `afd run --json` prints per prompt, shared by the in-process run and the AFD
// deployment (whose attention workers write these lines and `afd run --topology` merges them):
//   {"prompt_ids": [...], "output_ids": [...], "prompt_logprobs": [null, ...],
//    "prompt_top1": [null, ...] (with prompt log-probs: each position's most likely next id),
//    "logprobs": [...]}
#pragma once

#include <string>

#include "afd/runtime/generator.h"

namespace afd::deploy {

std::string ResultJsonLine(const runtime::GenerationResult& result);

}  // namespace afd::deploy

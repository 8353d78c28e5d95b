// libFuzzer target: see fuzz_targets.h. Run through `make fuzz`.
#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  afd::fuzz::EngineMessageInput(data, size);
  return 0;
}

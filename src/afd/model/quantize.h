// `afd quantize`: an FP8 copy of a checkpoint in DeepSeek-V3's format, so that FP8 paths can be
// measured on checkpoints whose bf16 form is known (issue 43's fidelity runs). Every Linear weight
// the model reads but the routers' becomes F8_E4M3 with a float32 `<name>_scale_inv` per
// block x block (edge blocks partial; scale = the block's max |w| / 448, as --quantization fp8
// rounds, so loading the copy gives --quantization fp8's model bit for bit); embeddings, the
// lm_head, norms, routers and biases stay as they are. config.json gains quantization_config;
// the directory's other files (tokenizer, generation config, ...) are copied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace afd::model {

struct QuantizeReport {
  int64_t quantized = 0;                // tensors written as F8_E4M3 (each with its scales)
  int64_t kept = 0;                     // tensors written as they were
  int64_t bytes_in = 0, bytes_out = 0;  // tensor bytes read and written
  // Tensors of the source the model does not read (e.g. MTP layers): not written.
  std::vector<std::string> dropped;
  std::vector<std::string> copied_files;  // besides config.json and the safetensors
};

// Writes the copy of checkpoint directory `src` to `dst` (a new or empty directory), one
// model.safetensors. Throws afd::Error naming the file or tensor: a source that is quantized
// already, a block outside 1..1024, `dst` not empty or the source itself.
QuantizeReport QuantizeCheckpointFp8(const std::string& src, const std::string& dst, int64_t block);

}  // namespace afd::model

// A Hugging Face checkpoint directory: config.json plus safetensors, either one or more
// *.safetensors files, or shards listed by model.safetensors.index.json ("weight_map": tensor
// name -> file). All files are memory-mapped and validated on Open.
// Thread safety: immutable after Open; const methods may be called from any thread.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "afd/model/safetensors.h"

namespace afd::model {

// Parses model.safetensors.index.json text (named `index_path` in errors) into tensor name ->
// shard file name. Throws afd::Error naming the file and the weight_map entry on invalid JSON,
// duplicate keys, a non-string shard, or a shard that is not a plain "*.safetensors" file name
// (a path such as "../x" or "/etc/x" could read outside the model directory).
std::map<std::string, std::string> ParseSafetensorsIndex(std::string_view text,
                                                         const std::string& index_path);

class Checkpoint {
 public:
  // Throws afd::Error naming the file (and tensor) when something is missing or malformed:
  // a shard named by the index is missing, a tensor listed in the index is not in its shard,
  // or a tensor name appears in two files.
  static Checkpoint Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string config_path() const { return dir_ + "/config.json"; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  // The tensor `name`, which must exist, have exactly `shape` and an element type the model
  // reads (F32, BF16, F16); the error names the file and the tensor otherwise.
  const TensorInfo& Get(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

 private:
  std::string dir_;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace afd::model

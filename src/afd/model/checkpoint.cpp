#include "afd/model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "afd/common/error.h"
#include "afd/config/json_fields.h"

namespace afd::model {

namespace fs = std::filesystem;

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::map<std::string, std::string> ParseSafetensorsIndex(std::string_view text,
                                                         const std::string& index_path) {
  const nlohmann::json index = json_fields::ParseStrict(text, index_path);
  AFD_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
            "{}: no \"weight_map\" object", index_path);
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : index["weight_map"].items()) {
    AFD_CHECK(file.is_string(), "{}: weight_map.{}: the shard must be a file name string, got {}",
              index_path, name, json_fields::Describe(file));
    const std::string shard = file.get<std::string>();
    // A shard is a plain file name inside the model directory: no path of any kind.
    const bool plain =
        !shard.empty() && shard != "." && shard != ".." &&
        shard.find_first_of("/\\") == std::string::npos &&
        std::none_of(shard.begin(), shard.end(), [](char c) { return c >= 0 && c < 0x20; });
    AFD_CHECK(plain,
              "{}: weight_map.{}: shard \"{}\" is not a plain file name in the model directory "
              "(no '/', '\\', control characters, '..' or empty names)",
              index_path, name, shard);
    AFD_CHECK(shard.size() > 12 && shard.ends_with(".safetensors"),
              "{}: weight_map.{}: shard \"{}\" is not a .safetensors file", index_path, name,
              shard);
    weight_map[name] = shard;
  }
  return weight_map;
}

Checkpoint Checkpoint::Open(const std::string& dir) {
  AFD_CHECK(fs::is_directory(dir), "model directory {} does not exist", dir);
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file name, from the index
  std::set<std::string> files;
  if (fs::exists(index_path)) {
    std::ifstream in(index_path, std::ios::binary);
    AFD_CHECK(in.good(), "{}: cannot read", index_path.string());
    std::stringstream text;
    text << in.rdbuf();
    weight_map = ParseSafetensorsIndex(text.str(), index_path.string());
    for (const auto& [name, file] : weight_map) files.insert(file);
  } else {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() == ".safetensors") files.insert(entry.path().filename());
    }
    AFD_CHECK(!files.empty(), "{}: no *.safetensors files and no model.safetensors.index.json",
              dir);
  }
  for (const std::string& name : files) {
    const std::string path = (fs::path(dir) / name).string();
    AFD_CHECK(fs::exists(path), "{}: shard {} listed in the index is missing", dir, name);
    AFD_CHECK(fs::is_regular_file(path), "{}: shard {} is not a regular file", dir, name);
    SafetensorsFile file = SafetensorsFile::Open(path);
    for (const auto& [tensor_name, info] : file.tensors()) {
      auto [it, inserted] = ckpt.tensors_.emplace(tensor_name, info);
      AFD_CHECK(inserted, "tensor {} is in both {} and {}", tensor_name, it->second.file, path);
    }
  }
  for (const auto& [name, file] : weight_map) {
    const TensorInfo* t = ckpt.Find(name);
    AFD_CHECK(t != nullptr && fs::path(t->file).filename() == file,
              "{}: tensor {} is listed in model.safetensors.index.json but missing",
              (fs::path(dir) / file).string(), name);
  }
  return ckpt;
}

const TensorInfo* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& Checkpoint::Get(const std::string& name,
                                  const std::vector<int64_t>& shape) const {
  const TensorInfo* t = Find(name);
  AFD_CHECK(t != nullptr, "{}: tensor {} is missing from the checkpoint", dir_, name);
  AFD_CHECK(t->shape == shape, "{}: tensor {} has shape {}, the config implies {}", t->file, name,
            t->ShapeString(), ShapeString(shape));
  AFD_CHECK(t->dtype.has_value(), "{}: tensor {} has dtype {}; supported: F32, BF16, F16", t->file,
            name, t->dtype_name);
  return *t;
}

}  // namespace afd::model

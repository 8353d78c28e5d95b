#include "afd/model/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "afd/common/error.h"

namespace afd::model {

namespace fs = std::filesystem;

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

Checkpoint Checkpoint::Open(const std::string& dir) {
  AFD_CHECK(fs::is_directory(dir), "model directory {} does not exist", dir);
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file name, from the index
  std::set<std::string> files;
  if (fs::exists(index_path)) {
    nlohmann::json index;
    try {
      std::ifstream in(index_path);
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      AFD_THROW("{}: invalid JSON: {}", index_path.string(), e.what());
    }
    AFD_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              "{}: no \"weight_map\" object", index_path.string());
    for (const auto& [name, file] : index["weight_map"].items()) {
      AFD_CHECK(file.is_string(), "{}: tensor {}: file name must be a string", index_path.string(),
                name);
      weight_map[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
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

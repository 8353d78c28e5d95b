#include "afd/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "afd/common/error.h"
#include "afd/config/json_fields.h"

namespace afd::model {

namespace {

using nlohmann::json;

// Element size of every safetensors dtype; 0 for unknown.
int ElementSize(const std::string& dtype) {
  static const std::map<std::string, int> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

std::optional<DType> ModelDType(const std::string& dtype) {
  if (dtype == "F32") return DType::kF32;
  if (dtype == "BF16") return DType::kBF16;
  if (dtype == "F16") return DType::kF16;
  return std::nullopt;
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  AFD_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    AFD_THROW("cannot stat {}: {}", path, std::strerror(errno));
  }
  auto file = std::shared_ptr<MappedFile>(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      AFD_THROW("cannot mmap {}: {}", path, std::strerror(errno));
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // Parse guarantees this does not overflow
  return n;
}

std::string TensorInfo::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile SafetensorsFile::Open(const std::string& path) {
  std::shared_ptr<MappedFile> map = MappedFile::Open(path);
  return Parse(map->data(), map->size(), path, map);
}

SafetensorsFile SafetensorsFile::Parse(const uint8_t* bytes, size_t size, const std::string& path,
                                       std::shared_ptr<const void> keep_alive) {
  AFD_CHECK(size >= 8, "{}: truncated safetensors file ({} bytes, the header length needs 8)", path,
            size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  AFD_CHECK(header_len <= size - 8, "{}: header length {} runs past the end of the file ({} bytes)",
            path, header_len, size);
  AFD_CHECK(header_len <= kMaxHeaderBytes,
            "{}: header length {} exceeds the format's limit of {} bytes", path, header_len,
            kMaxHeaderBytes);
  const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_len);
  // Strict: a key given twice (two entries for one tensor) is an error, not a silent overwrite.
  const json header = json_fields::ParseStrict(header_text, path + ": safetensors header");
  AFD_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", path);
  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  SafetensorsFile file;
  file.path_ = path;
  std::vector<std::pair<uint64_t, std::string>> spans;  // (begin, name) of non-empty tensors
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      AFD_CHECK(entry.is_object(), "{}: __metadata__ must be an object of strings", path);
      for (const auto& [key, value] : entry.items()) {
        AFD_CHECK(value.is_string(), "{}: __metadata__.{} must be a string, got {}", path, key,
                  json_fields::Describe(value));
      }
      continue;
    }
    AFD_CHECK(entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() &&
                  entry.contains("shape") && entry["shape"].is_array() &&
                  entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                  entry["data_offsets"].size() == 2,
              "{}: tensor {}: header entry needs dtype, shape and data_offsets [begin, end]", path,
              name);
    TensorInfo t;
    t.name = name;
    t.file = path;
    t.dtype_name = entry["dtype"].get<std::string>();
    const int elem = ElementSize(t.dtype_name);
    AFD_CHECK(elem > 0, "{}: tensor {}: unknown dtype \"{}\"", path, name, t.dtype_name);
    t.dtype = ModelDType(t.dtype_name);
    AFD_CHECK(entry["shape"].size() <= kMaxDims, "{}: tensor {}: shape has {} dimensions (max {})",
              path, name, entry["shape"].size(), kMaxDims);
    // numel and the byte size must fit in int64 / uint64: a crafted shape must not wrap around
    // to a small number that then matches small data_offsets.
    int64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      AFD_CHECK(d.is_number_integer(), "{}: tensor {}: bad shape {}", path, name,
                json_fields::Describe(entry["shape"]));
      AFD_CHECK(!d.is_number_unsigned() || d.get<uint64_t>() <= INT64_MAX,
                "{}: tensor {}: shape {} has a dimension beyond int64", path, name,
                json_fields::Describe(entry["shape"]));
      const int64_t dim = d.get<int64_t>();
      AFD_CHECK(dim >= 0, "{}: tensor {}: bad shape {}", path, name,
                json_fields::Describe(entry["shape"]));
      AFD_CHECK(!__builtin_mul_overflow(numel, dim, &numel),
                "{}: tensor {}: shape {} has more elements than fit in 64 bits", path, name,
                json_fields::Describe(entry["shape"]));
      t.shape.push_back(dim);
    }
    uint64_t needed = 0;
    AFD_CHECK(
        !__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(elem), &needed),
        "{}: tensor {}: {} {} is too large to address", path, name, t.dtype_name, t.ShapeString());
    const auto& off = entry["data_offsets"];
    AFD_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(),
              "{}: tensor {}: data_offsets must be non-negative integers, got {}", path, name,
              json_fields::Describe(off));
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    AFD_CHECK(begin <= end && end <= data_size,
              "{}: tensor {}: data_offsets [{}, {}] out of range (data section is {} bytes)", path,
              name, begin, end, data_size);
    AFD_CHECK(end - begin == needed, "{}: tensor {}: {} bytes in data_offsets, but {} {} needs {}",
              path, name, end - begin, t.dtype_name, t.ShapeString(), needed);
    // Kernels read elements in place (e.g. bf16 as uint16_t): each must be naturally aligned.
    AFD_CHECK(reinterpret_cast<uintptr_t>(data + begin) % elem == 0,
              "{}: tensor {}: data starts at file offset {}, not a multiple of its {}-byte "
              "element size ({})",
              path, name, 8 + header_len + begin, elem, t.dtype_name);
    t.data = data + begin;
    t.num_bytes = end - begin;
    t.keep_alive = keep_alive;
    if (end > begin) spans.emplace_back(begin, name);
    file.tensors_.emplace(name, std::move(t));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const TensorInfo& prev = file.tensors_.at(spans[i - 1].second);
    AFD_CHECK(spans[i - 1].first + prev.num_bytes <= spans[i].first,
              "{}: tensors {} and {} overlap in the data section", path, prev.name,
              spans[i].second);
  }
  return file;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype_name},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // keep the data 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  AFD_CHECK(out.good(), "cannot write {}", path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), text.size());
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  AFD_CHECK(out.good(), "error writing {}", path);
}

}  // namespace afd::model

// Reading safetensors files (https://github.com/huggingface/safetensors, format below) through
// a read-only memory map; tensors are views into the map, nothing is copied.
//
// Format: 8 bytes little-endian u64 N | N bytes JSON header | data. The header maps each tensor
// name to {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]} (offsets relative to
// the data section), plus an optional "__metadata__" object of strings.
//
// Open() validates everything that later reads rely on and reports the file (and tensor):
// header length past the end, bad JSON, unknown dtype, bad shape, offsets out of range, size
// not matching dtype x shape, and overlapping tensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afd/common/dtype_convert.h"

namespace afd::model {

// A read-only mmap of a whole file; unmapped when the last reference goes away.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

struct TensorInfo {
  std::string name;
  std::string dtype_name;      // as in the header, e.g. "BF16", "F8_E4M3"
  std::optional<DType> dtype;  // set for the element types the model can read
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the file's map
  size_t num_bytes = 0;
  std::string file;                        // path of the file holding it
  std::shared_ptr<const void> keep_alive;  // the map

  int64_t numel() const;
  std::string ShapeString() const;  // "[2, 3]"
};

class SafetensorsFile {
 public:
  // The format's limit on the header (safetensors rejects larger ones too).
  static constexpr uint64_t kMaxHeaderBytes = 100u << 20;
  static constexpr size_t kMaxDims = 16;

  // Maps and validates `path`; throws afd::Error naming the file (and tensor) on bad input.
  static SafetensorsFile Open(const std::string& path);
  // Validates the file image bytes[0..size) (named `path` in errors); tensors point into it and
  // hold `keep_alive`. Besides the checks listed above: duplicate header keys, element counts
  // or byte sizes that overflow 64 bits, data not aligned to its element size, more than
  // kMaxDims dimensions, a header over kMaxHeaderBytes, non-string metadata.
  static SafetensorsFile Parse(const uint8_t* bytes, size_t size, const std::string& path,
                               std::shared_ptr<const void> keep_alive);

  const std::string& path() const { return path_; }
  // Tensors sorted by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;

 private:
  std::string path_;
  std::map<std::string, TensorInfo> tensors_;
};

// Writes a safetensors file holding `tensors` (name, dtype name, shape, raw bytes), in order;
// used by tests and tools. Throws afd::Error when the file cannot be written.
struct TensorToWrite {
  std::string name;
  std::string dtype_name;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace afd::model

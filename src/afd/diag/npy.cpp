#include "afd/diag/npy.h"

#include <fstream>

#include "afd/common/error.h"

namespace afd::diag {

void WriteNpyF32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;  // "(2, 3)", and "(2,)" for one dimension
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += (i ? ", " : "") + std::to_string(shape[i]);
    count *= shape[i];
  }
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  AFD_CHECK(out.good(), "cannot write {}", path);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char*>(data), count * sizeof(float));
  AFD_CHECK(out.good(), "error writing {}", path);
}

}  // namespace afd::diag

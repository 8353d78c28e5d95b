// Writing float32 arrays as NumPy .npy files (format version 1.0, little-endian, C order).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace afd::diag {

// Writes data (row-major, product of shape elements) to path; throws afd::Error on I/O errors.
void WriteNpyF32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace afd::diag

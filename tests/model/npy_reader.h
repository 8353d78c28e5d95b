// Minimal reader of float32 little-endian C-order .npy files (the golden logits), for tests.
#pragma once

#include <cstdint>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace afd::testing {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

inline NpyArray ReadNpyF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  char magic[8];
  in.read(magic, 8);
  if (std::string(magic, 6) != "\x93NUMPY") throw std::runtime_error(path + ": not .npy");
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint8_t b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    uint8_t b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (header.find("'<f4'") == std::string::npos || header.find("False") == std::string::npos) {
    throw std::runtime_error(path + ": expected little-endian float32 C order: " + header);
  }
  NpyArray a;
  std::smatch m;
  std::regex shape_re("\\(([0-9, ]*)\\)");
  if (!std::regex_search(header, m, shape_re)) throw std::runtime_error(path + ": no shape");
  std::stringstream ss(m[1].str());
  std::string dim;
  int64_t count = 1;
  while (std::getline(ss, dim, ',')) {
    if (dim.find_first_not_of(' ') == std::string::npos) continue;
    a.shape.push_back(std::stoll(dim));
    count *= a.shape.back();
  }
  a.data.resize(count);
  in.read(reinterpret_cast<char*>(a.data.data()), count * sizeof(float));
  if (!in) throw std::runtime_error(path + ": truncated");
  return a;
}

}  // namespace afd::testing

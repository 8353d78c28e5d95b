// Minimal PNG encoding of an 8-bit RGB raster (for `afd bench serve --plot`): one IHDR, one
// zlib-compressed IDAT (every row with filter type 0), IEND; each chunk with its CRC-32.
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace afd::bench_client {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // (height, width, 3), row-major
};

// The PNG file bytes. Throws afd::Error for an empty image or a failing compressor.
std::string EncodePng(const RgbImage& image);

}  // namespace afd::bench_client

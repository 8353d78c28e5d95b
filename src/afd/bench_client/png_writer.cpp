#include "afd/bench_client/png_writer.h"

#include <zlib.h>

#include "afd/common/error.h"

namespace afd::bench_client {

namespace {

void PutU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

// length, type, data, CRC-32 of type + data.
void PutChunk(std::string& out, const char type[4], const std::string& data) {
  PutU32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.append(type, 4);
  out.append(data);
  const auto* crc_bytes = reinterpret_cast<const Bytef*>(out.data() + type_at);
  PutU32(out, static_cast<uint32_t>(crc32(0L, crc_bytes, static_cast<uInt>(4 + data.size()))));
}

}  // namespace

std::string EncodePng(const RgbImage& image) {
  AFD_CHECK(image.width > 0 && image.height > 0 &&
                image.rgb.size() == size_t(image.width) * size_t(image.height) * 3,
            "PNG of {}x{} pixels with {} bytes: not a valid RGB image", image.width, image.height,
            image.rgb.size());
  const size_t row_bytes = size_t(image.width) * 3;
  std::string raw;
  raw.reserve((row_bytes + 1) * size_t(image.height));
  for (int y = 0; y < image.height; ++y) {
    raw.push_back('\0');  // filter type 0 (None)
    raw.append(reinterpret_cast<const char*>(image.rgb.data()) + size_t(y) * row_bytes, row_bytes);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packed_size, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                           reinterpret_cast<const Bytef*>(raw.data()),
                           static_cast<uLong>(raw.size()), Z_BEST_COMPRESSION);
  AFD_CHECK(rc == Z_OK, "PNG encoding: zlib compress2 failed with code {}", rc);
  packed.resize(packed_size);

  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  PutU32(ihdr, static_cast<uint32_t>(image.width));
  PutU32(ihdr, static_cast<uint32_t>(image.height));
  ihdr +=
      std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit depth, RGB, deflate, filter 0, no interlace
  PutChunk(png, "IHDR", ihdr);
  PutChunk(png, "IDAT", packed);
  PutChunk(png, "IEND", "");
  return png;
}

}  // namespace afd::bench_client

#include "afd/diag/row_io.h"

#include <cstdint>
#include <cstring>

namespace afd::diag {

namespace {

class HostRowIo : public RowIo {
 public:
  void* Buffer(size_t bytes, int slot) override {
    auto& b = buffers_[slot & 1];
    if (b.size() < bytes) b.resize(bytes);
    return b.data();
  }
  void Upload(void* dst, const std::vector<char>& src) override {
    if (!src.empty()) std::memcpy(dst, src.data(), src.size());
  }
  void Download(std::vector<char>& dst, const void* src, size_t bytes) override {
    dst.resize(bytes);
    if (bytes) std::memcpy(dst.data(), src, bytes);
  }
  void Synchronize(double) override {}
  void ApplyFfnFunction(void* data, size_t count, size_t width) override {
    for (size_t i = 0; i < count; ++i) {
      if (width == 2) {
        uint16_t* p = static_cast<uint16_t*>(data) + i;
        *p = static_cast<uint16_t>(3u * *p + 1u);
      } else {
        uint32_t* p = static_cast<uint32_t*>(data) + i;
        *p = 3u * *p + 1u;
      }
    }
  }

 private:
  std::vector<char> buffers_[2];
};

}  // namespace

std::unique_ptr<RowIo> MakeHostRowIo() { return std::make_unique<HostRowIo>(); }

}  // namespace afd::diag

// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the rendezvous store's join-secret
// challenge/response. Small and dependency-free on purpose: the runtime links no crypto library.
// Tested against the FIPS 180-4 examples and RFC 4231 (tests/comm/hmac_test.cpp).
//
// Thread safety: Sha256 objects are used by one thread at a time; the free functions are pure.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace afd {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t bytes);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // The digest; the object must not be updated afterwards.
  Digest Finish();

 private:
  void Block(const uint8_t* p);  // compresses one 64-byte block into state_

  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest Sha256Of(std::string_view data);
Digest HmacSha256(std::string_view key, std::string_view message);

// Compares two digests in time independent of where they differ.
bool DigestsEqual(std::string_view a, std::string_view b);

// Lower-case hex of raw bytes.
std::string ToHex(std::string_view bytes);
// The bytes of lower- or upper-case hex; nullopt when `hex` is not an even run of hex digits.
std::optional<std::string> FromHex(std::string_view hex);
inline std::string_view AsBytes(const Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

// `bytes` bytes from the kernel's random source (getrandom). Throws afd::Error if unavailable.
std::string RandomBytes(size_t bytes);

}  // namespace afd

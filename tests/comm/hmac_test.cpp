// SHA-256 against FIPS 180-4's examples and HMAC-SHA256 against RFC 4231's test cases.
#include <gtest/gtest.h>

#include "afd/common/sha256.h"

namespace afd {
namespace {

std::string Hex(const Digest& d) { return ToHex(AsBytes(d)); }

TEST(Sha256, Fips180Examples) {
  EXPECT_EQ(Hex(Sha256Of("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a's, fed in uneven pieces so the block buffering is exercised.
  Sha256 h;
  const std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, chunk.size());
    h.Update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(Hex(h.Finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HmacSha256, Rfc4231TestCases) {
  struct Case {
    std::string key, data, hmac;
  };
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  const std::vector<Case> cases = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The "
       "key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(Hex(HmacSha256(cases[i].key, cases[i].data)), cases[i].hmac) << "case " << i + 1;
  }
}

TEST(HmacSha256, DigestsEqualComparesEveryByte) {
  const std::string a = std::string(AsBytes(Sha256Of("x")));
  std::string b = a;
  EXPECT_TRUE(DigestsEqual(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(DigestsEqual(a, b));
  EXPECT_FALSE(DigestsEqual(a, a.substr(0, 31)));
  EXPECT_NE(RandomBytes(32), RandomBytes(32));
}

TEST(Hex, RoundTripsEveryByteAndRefusesWhatIsNotHex) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(FromHex(ToHex(all)), all);
  EXPECT_EQ(FromHex("00FFa5"), std::string("\x00\xff\xa5", 3));
  EXPECT_EQ(FromHex(""), std::string());
  EXPECT_EQ(FromHex("abc"), std::nullopt);  // odd length
  EXPECT_EQ(FromHex("0g"), std::nullopt);   // not a digit
  EXPECT_EQ(FromHex("-1"), std::nullopt);
}

}  // namespace
}  // namespace afd

// Malformed safetensors files and checkpoints: each error must name the file and the tensor.
// Fixtures are written by the test itself.
#include "afd/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "afd/common/error.h"
#include "afd/model/checkpoint.h"

namespace afd::model {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("afd_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A raw file: 8-byte length (header_len, or the real length), header text, data bytes.
  std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                       int64_t header_len = -1) {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
    out << header << std::string(data_bytes, '\0');
    return path;
  }

  // Expects Open to throw an error mentioning every string of `needles`.
  void ExpectOpenError(const std::string& path, std::initializer_list<std::string> needles) {
    try {
      SafetensorsFile::Open(path);
      FAIL() << "no error for " << path;
    } catch (const Error& e) {
      for (const auto& n : needles) {
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
      }
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, ReadsValidFile) {
  TensorToWrite a{"a", "F32", {2, 3}, std::vector<uint8_t>(24, 0)};
  TensorToWrite b{"b", "BF16", {4}, std::vector<uint8_t>(8, 0)};
  a.bytes[0] = 0x00;
  a.bytes[1] = 0x00;
  a.bytes[2] = 0x80;
  a.bytes[3] = 0x3f;  // 1.0f
  WriteSafetensors(Path("ok.safetensors"), {a, b});
  const SafetensorsFile f = SafetensorsFile::Open(Path("ok.safetensors"));
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorInfo* t = f.Find("a");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*t->dtype, DType::kF32);
  EXPECT_EQ(static_cast<const float*>(t->data)[0], 1.0f);
  EXPECT_EQ(f.Find("b")->num_bytes, 8u);
}

TEST_F(SafetensorsTest, TruncatedFile) {
  const std::string path = Path("trunc.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  ExpectOpenError(path, {path, "truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthPastEnd) {
  const std::string path = WriteRaw("len.safetensors", "{}", 0, 1000);
  ExpectOpenError(path, {path, "header length 1000"});
}

TEST_F(SafetensorsTest, BadHeaderJson) {
  const std::string path = WriteRaw("json.safetensors", "{\"a\": [", 0);
  ExpectOpenError(path, {path, "JSON"});
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  const std::string path = WriteRaw(
      "range.safetensors", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  ExpectOpenError(path, {path, "tensor w", "out of range"});
}

TEST_F(SafetensorsTest, SizeNotMatchingShape) {
  const std::string path = WriteRaw(
      "size.safetensors", R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})", 16);
  ExpectOpenError(path, {path, "tensor w", "needs 8"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  const std::string path = WriteRaw("overlap.safetensors",
                                    R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                    12);
  ExpectOpenError(path, {path, "a", "b", "overlap"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  const std::string path = WriteRaw(
      "dtype.safetensors", R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})", 2);
  ExpectOpenError(path, {path, "tensor w", "Q4"});
}

TEST_F(SafetensorsTest, CheckpointErrorsNameFileAndTensor) {
  WriteSafetensors(Path("model-1.safetensors"), {{"x", "F32", {2, 2}, std::vector<uint8_t>(16, 0)},
                                                 {"i", "I32", {2}, std::vector<uint8_t>(8, 0)}});
  const Checkpoint ckpt = Checkpoint::Open(dir_.string());
  auto expect_error = [](auto fn, std::initializer_list<std::string> needles) {
    try {
      fn();
      FAIL() << "no error";
    } catch (const Error& e) {
      for (const auto& n : needles) {
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
      }
    }
  };
  EXPECT_NO_THROW(ckpt.Get("x", {2, 2}));
  expect_error([&] { ckpt.Get("missing.weight", {2}); }, {"missing.weight", "missing"});
  expect_error([&] { ckpt.Get("x", {2, 3}); }, {"model-1.safetensors", "tensor x", "[2, 3]"});
  expect_error([&] { ckpt.Get("i", {2}); }, {"model-1.safetensors", "tensor i", "I32"});
}

TEST_F(SafetensorsTest, ShardedIndex) {
  WriteSafetensors(Path("s1.safetensors"), {{"a", "F32", {1}, std::vector<uint8_t>(4, 0)}});
  WriteSafetensors(Path("s2.safetensors"), {{"b", "F16", {1}, std::vector<uint8_t>(2, 0)}});
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"metadata": {"total_size": 6}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})";
  const Checkpoint ckpt = Checkpoint::Open(dir_.string());
  EXPECT_NE(ckpt.Find("a"), nullptr);
  EXPECT_EQ(*ckpt.Find("b")->dtype, DType::kF16);

  // The index names a tensor its shard lacks.
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"weight_map": {"a": "s1.safetensors", "c": "s2.safetensors"}})";
  try {
    Checkpoint::Open(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor c"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("s2.safetensors"), std::string::npos) << e.what();
  }
  // The index names a missing shard.
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"weight_map": {"a": "s1.safetensors", "d": "s3.safetensors"}})";
  EXPECT_THROW(Checkpoint::Open(dir_.string()), Error);
}

TEST_F(SafetensorsTest, ElementCountOverflowIsRejected) {
  // 2^32 x 2^32 elements wraps to 0 in 64 bits: it must not match an empty data range.
  ExpectOpenError(
      WriteRaw(
          "wrap.safetensors",
          R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
          0),
      {"wrap.safetensors", "tensor t", "more elements than fit in 64 bits"});
  // numel fits, numel x 8 bytes does not.
  ExpectOpenError(
      WriteRaw("bytes.safetensors",
               R"({"t": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})",
               0),
      {"bytes.safetensors", "tensor t", "too large to address"});
  ExpectOpenError(WriteRaw("neg.safetensors",
                           R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", 0),
                  {"neg.safetensors", "tensor t", "bad shape"});
  ExpectOpenError(WriteRaw("float.safetensors",
                           R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 8),
                  {"float.safetensors", "tensor t", "bad shape"});
}

TEST_F(SafetensorsTest, MisalignedDataIsRejected) {
  // Header padded to 8 bytes; a BF16 tensor starting at data offset 1 is misaligned.
  std::string header =
      R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "b": {"dtype": "BF16", "shape": [2], "data_offsets": [1, 5]}})";
  while (header.size() % 8 != 0) header += ' ';
  ExpectOpenError(WriteRaw("misaligned.safetensors", header, 8),
                  {"misaligned.safetensors", "tensor b", "not a multiple of its 2-byte element"});
}

TEST_F(SafetensorsTest, DuplicateTensorEntriesAndBadMetadataAreRejected) {
  ExpectOpenError(
      WriteRaw(
          "dup.safetensors",
          R"({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "t": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
          8),
      {"dup.safetensors", "key \"t\" appears more than once"});
  ExpectOpenError(WriteRaw("meta.safetensors", R"({"__metadata__": {"format": 5}})", 0),
                  {"meta.safetensors", "__metadata__.format must be a string"});
  ExpectOpenError(
      WriteRaw(
          "dims.safetensors",
          R"({"t": {"dtype": "U8", "shape": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], "data_offsets": [0, 1]}})",
          8),
      {"dims.safetensors", "tensor t", "17 dimensions"});
}

TEST_F(SafetensorsTest, HugeHeaderLengthIsRejected) {
  ExpectOpenError(WriteRaw("huge.safetensors", "{}", 0, int64_t{1} << 62),
                  {"huge.safetensors", "runs past the end"});
}

TEST_F(SafetensorsTest, IndexShardNamesCannotLeaveTheModelDirectory) {
  auto message = [](const std::string& text) {
    try {
      ParseSafetensorsIndex(text, "dir/model.safetensors.index.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const std::string bad :
       {"../secret.safetensors", "/etc/passwd.safetensors", "sub/x.safetensors", "..", "",
        "a\\\\b.safetensors", "a\\u0000b.safetensors", "a\\nb.safetensors"}) {
    const std::string m = message(R"({"weight_map": {"w": ")" + bad + R"("}})");
    EXPECT_NE(m.find("dir/model.safetensors.index.json: weight_map.w: shard"), std::string::npos)
        << bad << " -> " << m;
  }
  EXPECT_NE(message(R"({"weight_map": {"w": "passwd"}})").find("is not a .safetensors file"),
            std::string::npos);
  EXPECT_NE(message(R"({"weight_map": {"w": 5}})").find("must be a file name string"),
            std::string::npos);
  EXPECT_NE(message(R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})")
                .find("appears more than once"),
            std::string::npos);
  EXPECT_NE(message("[1]").find("no \"weight_map\" object"), std::string::npos);
  EXPECT_EQ(ParseSafetensorsIndex(R"({"weight_map": {"w": "model-1.safetensors"}})", "i").at("w"),
            "model-1.safetensors");
  // Through Checkpoint::Open too: the traversal never reaches the file system.
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"weight_map": {"w": "../../etc/shadow.safetensors"}})";
  try {
    Checkpoint::Open(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a plain file name"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace afd::model

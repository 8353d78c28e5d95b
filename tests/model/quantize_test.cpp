// `afd quantize` (model/quantize.h): the FP8 copy of a checkpoint loads as the source under
// --quantization fp8, bit for bit -- the same rounding, read back from the files -- for MLA and
// GQA models, tied embeddings and fp16 sources; what stays unquantized stays as it was; bad
// requests are refused by name.
#include "afd/model/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/checkpoint.h"
#include "afd/model/loader.h"
#include "testing/files.h"
#include "testing/model_harness.h"

namespace afd::model {
namespace {

namespace fs = std::filesystem;

std::string Golden(const std::string& name) {
  return std::string(AFD_SOURCE_DIR) + "/tests/data/golden/" + name;
}

std::vector<float> Logits(const MoeModel& model, const std::vector<int32_t>& ids) {
  return testing_util::PromptLogits(model, ids);
}

class QuantizeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeTest, TheCopyLoadsAsQuantizationFp8) {
  const std::string src = Golden(GetParam());
  const fs::path dst =
      fs::temp_directory_path() / ("afd_quantize_" + GetParam() + std::to_string(::getpid()));
  fs::remove_all(dst);
  const QuantizeReport r = QuantizeCheckpointFp8(src, dst.string(), 128);
  EXPECT_GT(r.quantized, 0);
  EXPECT_GT(r.kept, 0);
  EXPECT_LT(r.bytes_out, r.bytes_in);
  EXPECT_TRUE(r.dropped.empty());
  EXPECT_TRUE(fs::exists(dst / "model.safetensors"));
  const auto backend = kernels::MakeBackend(Device::Cpu());
  OpenOptions online;
  online.auto_bf16 = false;
  online.weights.fp8_block = 128;
  OpenOptions plain;
  plain.auto_bf16 = false;
  const auto a = OpenModel(src, online, *backend);
  const auto b = OpenModel(dst.string(), plain, *backend);
  EXPECT_EQ(b->config().fp8_block_n, 128);
  const std::vector<int32_t> ids = {3, 17, 9, 4, 4, 25, 1, 30};
  EXPECT_EQ(Logits(*b, ids), Logits(*a, ids));
  EXPECT_NE(Logits(*b, ids), Logits(*OpenModel(src, plain, *backend), ids)) << "nothing rounded";
  // Linear weights F8_E4M3 with scales; the router, norms and embedding as in the source.
  const Checkpoint in = Checkpoint::Open(src), out = Checkpoint::Open(dst.string());
  int fp8 = 0;
  for (const auto& [name, t] : out.tensors()) {
    if (t.dtype_name == "F8_E4M3") {
      ++fp8;
      EXPECT_NE(out.Find(name + "_scale_inv"), nullptr) << name;
      continue;
    }
    if (name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0) continue;
    const TensorInfo* s = in.Find(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(t.dtype_name, s->dtype_name) << name;
    EXPECT_EQ(std::string(static_cast<const char*>(t.data), t.num_bytes),
              std::string(static_cast<const char*>(s->data), s->num_bytes))
        << name;
  }
  EXPECT_EQ(fp8, r.quantized);
  for (const auto& [name, t] : out.tensors()) {
    const bool kept = name.find("norm") != std::string::npos ||
                      name.find("embed_tokens") != std::string::npos ||
                      name.find("mlp.gate.weight") != std::string::npos;
    if (kept) {
      EXPECT_NE(t.dtype_name, "F8_E4M3") << name;
    }
  }
  fs::remove_all(dst);
}

INSTANTIATE_TEST_SUITE_P(Goldens, QuantizeTest,
                         ::testing::Values("v3_trained", "qwen3_trained", "v2_tied_fp16"));

TEST(Quantize, BadRequestsAreRefusedByName) {
  const fs::path dst =
      fs::temp_directory_path() / ("afd_quantize_bad" + std::to_string(::getpid()));
  fs::remove_all(dst);
  const std::string src = Golden("v3_trained");
  const auto refused = [](const std::function<void()>& fn, const std::string& words) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([&] { QuantizeCheckpointFp8(src, dst.string(), 0); }, "--block 0 is outside 1..1024");
  refused([&] { QuantizeCheckpointFp8(src, src, 128); }, "is not an empty directory");
  // The command line: the copy, then a copy of the copy (quantized already).
  const std::string cmd = std::string(AFD_BINARY) + " quantize --model " + src + " --output " +
                          dst.string() + " 2>" + dst.string() + ".err";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing_util::ReadFile(dst.string() + ".err");
  EXPECT_NE(testing_util::ReadFile(dst.string() + ".err").find("tensors to F8_E4M3 in 128 x 128"),
            std::string::npos);
  const fs::path again = dst.string() + "_again";
  refused([&] { QuantizeCheckpointFp8(dst.string(), again.string(), 128); }, "quantized already");
  fs::remove_all(dst);
  fs::remove(dst.string() + ".err");
}

}  // namespace
}  // namespace afd::model

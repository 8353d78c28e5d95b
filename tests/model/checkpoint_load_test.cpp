// Round trip: a checkpoint written by the test in F32, BF16 and F16 (values exactly
// representable in all three) loads into a model whose logits are bit-identical to the model
// built directly from the same values; a checkpoint missing a tensor or with a wrong shape
// fails with the tensor's name.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/checkpoint.h"
#include "afd/model/loader.h"
#include "afd/model/safetensors.h"
#include "afd/model/weight_builder.h"
#include "testing/files.h"
#include "testing/model_harness.h"

namespace afd::model {
namespace {

namespace fs = std::filesystem;

uint16_t ExactF16(float f) {  // f is 0 or a normal half value
  if (f == 0.0f) return 0;
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t exp = ((b >> 23) & 0xff) - 112;
  return static_cast<uint16_t>(((b >> 16) & 0x8000) | (exp << 10) | ((b & 0x7fffff) >> 13));
}

// Fills each tensor with k/64, k in [-64, 64] (exact in F32, BF16 and F16; norms near 1), and
// records it for writing in `dtype`.
class RecordingSource : public TensorSource {
 public:
  explicit RecordingSource(const std::string& dtype) : dtype_(dtype) {}
  void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind,
            DType dst_type, void* dst) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    TensorToWrite t{name, dtype_, shape, {}};
    t.bytes.resize(n * (dtype_ == "F32" ? 4 : 2));
    uint64_t h = std::hash<std::string>()(name);
    for (int64_t i = 0; i < n; ++i) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      const int k = static_cast<int>((h >> 33) % 129) - 64;
      const float v = kind == TensorKind::kNorm ? 1.0f + k / 128.0f : k / 64.0f * 0.25f;
      if (dst_type == DType::kF32) {
        static_cast<float*>(dst)[i] = v;
      } else {
        static_cast<uint16_t*>(dst)[i] = F32ToBf16(v);
      }
      const uint16_t half = dtype_ == "BF16" ? F32ToBf16(v) : ExactF16(v);
      if (dtype_ == "F32") {
        std::memcpy(&t.bytes[4 * i], &v, 4);
      } else {
        std::memcpy(&t.bytes[2 * i], &half, 2);
      }
    }
    tensors.push_back(std::move(t));
  }
  std::vector<TensorToWrite> tensors;

 private:
  std::string dtype_;
};

std::string ConfigJson(const ModelConfig& c) {
  return fmt::format(R"({{"model_type": "deepseek_v2", "vocab_size": {}, "hidden_size": {},
    "intermediate_size": {}, "moe_intermediate_size": {}, "num_hidden_layers": {},
    "num_attention_heads": {}, "q_lora_rank": {}, "kv_lora_rank": {}, "qk_nope_head_dim": {},
    "qk_rope_head_dim": {}, "v_head_dim": {}, "n_routed_experts": {}, "n_shared_experts": {},
    "num_experts_per_tok": {}, "first_k_dense_replace": {}, "moe_layer_freq": {}, "n_group": {},
    "topk_group": {},
    "topk_method": "group_limited_greedy", "max_position_embeddings": {},
    "rope_scaling": {{"type": "yarn", "factor": {}, "original_max_position_embeddings": {},
                     "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}},
    "rope_theta": 10000, "bos_token_id": 0, "eos_token_id": 1}})",
                     c.vocab_size, c.hidden_size, c.intermediate_size, c.moe_intermediate_size,
                     c.num_hidden_layers, c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank,
                     c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.n_routed_experts,
                     c.n_shared_experts, c.num_experts_per_tok, c.first_k_dense_replace,
                     c.moe_layer_freq, c.n_group, c.topk_group, c.max_position_embeddings,
                     c.rope.factor, c.rope.original_max_position_embeddings);
}

std::vector<float> Logits(const MoeModel& model, const std::vector<int32_t>& ids) {
  return testing_util::PromptLogits(model, ids);
}

class CheckpointLoadTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("afd_ckpt_" + std::to_string(::getpid()) + GetParam());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(CheckpointLoadTest, RoundTripIsExact) {
  const ModelConfig config = PresetConfig("tiny");
  RecordingSource source(GetParam());
  const auto backend = kernels::MakeBackend(Device::Cpu());
  MoeModel direct(config, BuildWeights(config, WeightOptions{}, source), *backend);
  // Two shards, without an index: all *.safetensors of the directory are read.
  const size_t half = source.tensors.size() / 2;
  WriteSafetensors((dir_ / "a.safetensors").string(),
                   {source.tensors.begin(), source.tensors.begin() + half});
  WriteSafetensors((dir_ / "b.safetensors").string(),
                   {source.tensors.begin() + half, source.tensors.end()});
  std::ofstream(dir_ / "config.json") << ConfigJson(config);

  const auto loaded = OpenModel(dir_.string(), OpenOptions{}, *backend);
  const std::vector<int32_t> ids = {3, 17, 900, 4, 4, 250};
  EXPECT_EQ(Logits(*loaded, ids), Logits(direct, ids));

  // Missing tensor: rewrite the second shard without its first tensor.
  const std::string dropped = source.tensors[half].name;
  WriteSafetensors((dir_ / "b.safetensors").string(),
                   {source.tensors.begin() + half + 1, source.tensors.end()});
  try {
    OpenModel(dir_.string(), OpenOptions{}, *backend);
    FAIL() << "no error for a missing tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dropped), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CheckpointLoadTest, ::testing::Values("F32", "BF16", "F16"));

// An FP8 (E4M3) code of k / 8 for k in [-15, 15] (every such value is exact in E4M3), encoded
// from the value's binary form -- not by the loader's decoder, which the tests check.
uint8_t Fp8OfEighths(int k) {
  if (k == 0) return 0;
  int e = 0;
  const double f = std::frexp(std::abs(k) / 8.0, &e);  // |v| = f * 2^e, f in [0.5, 1)
  const int exponent = e - 1 + 7, mantissa = static_cast<int>((2 * f - 1) * 8);
  return static_cast<uint8_t>((k < 0 ? 0x80 : 0) | (exponent << 3) | mantissa);
}

// Linear weights as F8_E4M3 with a float32 weight_scale_inv per [16, 24] block (edge blocks
// partial: the tiny preset's sizes are not multiples of 24), the scales powers of two, so that
// every dequantized value k / 8 * 2^-s is exact in fp32 and the model can be built from them
// directly; other tensors F32.
class Fp8RecordingSource : public TensorSource {
 public:
  explicit Fp8RecordingSource(int64_t block_n = 16, int64_t block_k = 24)
      : kBlockN(block_n), kBlockK(block_k) {}
  const int64_t kBlockN, kBlockK;
  void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind,
            DType dst_type, void* dst) override {
    EXPECT_EQ(dst_type, DType::kF32);
    auto* out = static_cast<float*>(dst);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    uint64_t h = std::hash<std::string>()(name);
    const auto next = [&] {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<int>((h >> 33) % 31) - 15;
    };
    if (kind != TensorKind::kLinear || shape.size() != 2) {
      TensorToWrite t{name, "F32", shape, std::vector<uint8_t>(4 * n)};
      for (int64_t i = 0; i < n; ++i) {
        out[i] = kind == TensorKind::kNorm ? 1.0f + next() / 64.0f : next() / 64.0f;
        std::memcpy(&t.bytes[4 * i], &out[i], 4);
      }
      tensors.push_back(std::move(t));
      return;
    }
    const int64_t rows = shape[0], cols = shape[1];
    const int64_t sr = (rows + kBlockN - 1) / kBlockN, sc = (cols + kBlockK - 1) / kBlockK;
    TensorToWrite w{name, "F8_E4M3", shape, std::vector<uint8_t>(n)};
    TensorToWrite scale{name + "_scale_inv", "F32", {sr, sc}, std::vector<uint8_t>(4 * sr * sc)};
    std::vector<float> scales(sr * sc);
    for (int64_t b = 0; b < sr * sc; ++b) {
      scales[b] = std::ldexp(1.0f, -((next() + 15) % 4));  // 1, 1/2, 1/4 or 1/8
      std::memcpy(&scale.bytes[4 * b], &scales[b], 4);
    }
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const int k = next();
        w.bytes[i * cols + j] = Fp8OfEighths(k);
        out[i * cols + j] = k / 8.0f * scales[(i / kBlockN) * sc + j / kBlockK];
      }
    }
    tensors.push_back(std::move(w));
    tensors.push_back(std::move(scale));
  }
  std::vector<TensorToWrite> tensors;
};

std::string Fp8Config(const ModelConfig& c, const std::string& quantization) {
  std::string j = ConfigJson(c);
  j.insert(j.rfind('}'), ", \"quantization_config\": " + quantization);
  return j;
}

TEST(Fp8Checkpoint, DecodesE4M3Exactly) {
  EXPECT_EQ(Fp8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x7e), 448.0f);  // the largest
  EXPECT_EQ(Fp8E4M3ToF32(0xfe), -448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(Fp8E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(Fp8E4M3ToF32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToF32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(Fp8E4M3ToF32(0x80)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(0xff)));
  for (int k = -15; k <= 15; ++k) EXPECT_EQ(Fp8E4M3ToF32(Fp8OfEighths(k)), k / 8.0f) << k;
}

TEST(Fp8Checkpoint, EncodesE4M3RoundingToNearestEven) {
  for (int c = 0; c < 256; ++c) {
    if (c == 0x7f || c == 0xff) continue;  // NaN
    EXPECT_EQ(F32ToFp8E4M3(Fp8E4M3ToF32(static_cast<uint8_t>(c))), c) << c;
  }
  EXPECT_EQ(F32ToFp8E4M3(1.0625f), 0x38);  // halfway 1 / 1.125: the even mantissa
  EXPECT_EQ(F32ToFp8E4M3(1.1875f), 0x3a);  // halfway 1.125 / 1.25: 1.25
  EXPECT_EQ(F32ToFp8E4M3(1.07f), 0x39);
  EXPECT_EQ(F32ToFp8E4M3(1000.0f), 0x7e);  // saturates at 448
  EXPECT_EQ(F32ToFp8E4M3(-1000.0f), 0xfe);
  EXPECT_EQ(F32ToFp8E4M3(std::ldexp(1.0f, -11)), 0x00);          // below half the least subnormal
  EXPECT_EQ(F32ToFp8E4M3(1.5f * std::ldexp(1.0f, -9)), 0x02);    // halfway 1 / 2 subnormal steps
  EXPECT_EQ(F32ToFp8E4M3(15.5f * std::ldexp(1.0f, -10)), 0x08);  // carries into the least normal
  EXPECT_EQ(F32ToFp8E4M3(std::nanf("")), 0x7f);
}

// --quantization fp8: every Linear weight but the router's is its FP8 round trip in 128 x 128
// blocks (scale = the block's max |w| / 448); norms, embeddings and the router stay.
TEST(Fp8OnLoad, LinearWeightsAreRoundedThroughFp8Blocks) {
  const auto backend = kernels::MakeBackend(Device::Cpu());
  OpenOptions plain;
  plain.auto_bf16 = false;
  OpenOptions fp8 = plain;
  fp8.weights.fp8_block = 128;
  const auto a = OpenModel("preset:tiny", plain, *backend);
  const auto b = OpenModel("preset:tiny", fp8, *backend);
  const auto values = [](const Tensor& t) {
    const auto* p = static_cast<const float*>(t.data());
    return std::vector<float>(p, p + t.numel());
  };
  const int64_t moe_layer = a->config().first_k_dense_replace;
  const LayerWeights& la = a->weights().layers[moe_layer];
  const LayerWeights& lb = b->weights().layers[moe_layer];
  std::vector<float> o = values(la.attn.o_proj);
  RoundThroughFp8Blocks(o.data(), la.attn.o_proj.dim(0), la.attn.o_proj.dim(1), 128, 128);
  EXPECT_EQ(values(lb.attn.o_proj), o);
  EXPECT_NE(values(lb.attn.o_proj), values(la.attn.o_proj));  // it did round something
  EXPECT_EQ(values(lb.moe.gate), values(la.moe.gate));
  EXPECT_EQ(values(lb.attn.input_norm), values(la.attn.input_norm));
  EXPECT_EQ(values(b->weights().embed), values(a->weights().embed));
}

// A matrix of over 2^20 weights is rounded on several threads (rows of blocks each): the same
// values, codes and scales as block row by block row on one.
TEST(Fp8OnLoad, BigMatricesRoundTheSameOnThreads) {
  const int64_t rows = 1100, cols = 1000, bc = (cols + 127) / 128;  // the last block row partial
  std::vector<float> w(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) w[i] = std::sin(0.37 * i) * (1 + i % 7);
  std::vector<float> a = w, b = w, sa(9 * bc), sb(9 * bc);
  std::vector<uint8_t> ca(rows * cols), cb(rows * cols);
  RoundThroughFp8Blocks(a.data(), rows, cols, 128, 128, ca.data(), sa.data());
  for (int64_t r0 = 0; r0 < rows; r0 += 128) {
    RoundThroughFp8Blocks(b.data() + r0 * cols, std::min<int64_t>(128, rows - r0), cols, 128, 128,
                          cb.data() + r0 * cols, sb.data() + (r0 / 128) * bc);
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(ca, cb);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(a, w);
}

// DeepSeek-V3's format: the loaded model is the model of the dequantized weights, bit for bit;
// what is quantized is read from the files; a missing scale, a quantized tensor without the
// config's quantization_config, and other methods are refused by name.
TEST(Fp8Checkpoint, LoadsAsItsDequantizedWeights) {
  const fs::path dir = fs::temp_directory_path() / ("afd_fp8_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const ModelConfig config = PresetConfig("tiny");
  Fp8RecordingSource source;
  const auto backend = kernels::MakeBackend(Device::Cpu());
  MoeModel direct(config, BuildWeights(config, WeightOptions{}, source), *backend);
  WriteSafetensors((dir / "model.safetensors").string(), source.tensors);
  const std::string fp8 = R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                              "weight_block_size": [16, 24]})";
  std::ofstream(dir / "config.json") << Fp8Config(config, fp8);
  OpenOptions open;
  open.auto_bf16 = false;
  const auto loaded = OpenModel(dir.string(), open, *backend);
  EXPECT_EQ(loaded->config().fp8_block_n, 16);
  EXPECT_EQ(loaded->config().fp8_block_k, 24);
  const std::vector<int32_t> ids = {3, 17, 900, 4, 4, 250};
  EXPECT_EQ(Logits(*loaded, ids), Logits(direct, ids));
  // The AFD roles load their parts the same way: 1A2F (each FFN rank dequantizes its experts)
  // gives the monolithic output, log-probs included.
  const auto run = [&](const std::string& extra) {
    const std::string out = (dir / "run.out").string();
    const std::string cmd = std::string(AFD_BINARY) + " run --model " + dir.string() +
                            " --prompt-ids 3,17,900,4 --prompt-ids 250,6 --max-tokens 5 --json " +
                            extra + " >" + out + " 2>" + out + ".err";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return testing_util::ReadFile(out);
  };
  const std::string mono = run("");
  EXPECT_NE(mono.find("output_ids"), std::string::npos) << mono;
  EXPECT_EQ(run("--topology 1A2F"), mono);

  const auto refused = [&](const std::string& config_json, const std::string& words) {
    std::ofstream(dir / "config.json") << config_json;
    try {
      OpenModel(dir.string(), open, *backend);
      ADD_FAILURE() << "no error; expected: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(ConfigJson(config), "is F8_E4M3, but config.json has no FP8 quantization_config");
  refused(Fp8Config(config, R"({"quant_method": "awq", "bits": 4})"), "quant_method \"awq\"");
  refused(Fp8Config(config, R"({"quant_method": "fp8"})"), "weight_block_size must be [n, k]");
  refused(Fp8Config(config, R"({"quant_method": "fp8", "activation_scheme": "static",
                                "weight_block_size": [16, 24]})"),
          "activation_scheme \"static\"");
  // A scale missing: the weight is named with it.
  std::vector<TensorToWrite> without;
  std::string dropped;
  for (const TensorToWrite& t : source.tensors) {
    if (dropped.empty() && t.name.size() > 10 &&
        t.name.compare(t.name.size() - 10, 10, "_scale_inv") == 0) {
      dropped = t.name;
      continue;
    }
    without.push_back(t);
  }
  ASSERT_FALSE(dropped.empty());
  WriteSafetensors((dir / "model.safetensors").string(), without);
  refused(Fp8Config(config, fp8), dropped + " are missing");
  fs::remove_all(dir);
}

// The values an FP8 expert list stands for (code * its block's scale, the layout of
// kernels::ExpertWeights), expert by expert, gate_up then down.
std::vector<float> Fp8ExpertValues(const kernels::ExpertWeights& e) {
  std::vector<float> v;
  const auto add = [&v](const Tensor& codes, const Tensor& scales, int64_t split) {
    const int64_t rows = codes.dim(0), cols = codes.dim(1), sc = scales.dim(1);
    const int64_t split_blocks = (split + 127) / 128;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t br = i < split ? i / 128 : split_blocks + (i - split) / 128;
      for (int64_t j = 0; j < cols; ++j) {
        v.push_back(Fp8E4M3ToF32(codes.data_as<const uint8_t>()[i * cols + j]) *
                    scales.data_as<const float>()[br * sc + j / 128]);
      }
    }
  };
  for (int64_t x = 0; x < e.num_experts(); ++x) {
    add(e.gate_up[x], e.gate_up_scale[x], e.down[x].dim(1));
    add(e.down[x], e.down_scale[x], e.down[x].dim(0));
  }
  return v;
}

std::vector<float> ExpertValues(const kernels::ExpertWeights& e) {
  std::vector<float> v;
  for (int64_t x = 0; x < e.num_experts(); ++x) {
    for (const Tensor* t : {&e.gate_up[x], &e.down[x]}) {
      const auto* p = t->data_as<const float>();
      v.insert(v.end(), p, p + t->numel());
    }
  }
  return v;
}

// keep_fp8_experts (what a GPU holds under AFD_FP8_EXPERTS=1) with --quantization fp8: the
// routed experts are held as FP8 codes and 128 x 128 block scales standing for exactly the
// dequantized weights, and the CPU runs them to the same logits, bit for bit (tiny's sizes
// are not multiples of 128: partial edge blocks, up_proj's block rows after gate_proj's).
TEST(Fp8OnLoad, HeldFp8ExpertsAreTheDequantizedOnes) {
  const auto backend = kernels::MakeBackend(Device::Cpu());
  OpenOptions dequantized;
  dequantized.auto_bf16 = false;
  dequantized.weights.fp8_block = 128;
  OpenOptions held = dequantized;
  held.weights.keep_fp8_experts = true;
  const auto a = OpenModel("preset:tiny", dequantized, *backend);
  const auto b = OpenModel("preset:tiny", held, *backend);
  int moe_layers = 0;
  for (int64_t l = 0; l < a->config().num_hidden_layers; ++l) {
    if (!a->config().IsMoeLayer(l)) continue;
    ++moe_layers;
    const kernels::ExpertWeights& ea = a->weights().layers[l].moe.experts;
    const kernels::ExpertWeights& eb = b->weights().layers[l].moe.experts;
    EXPECT_FALSE(ea.fp8());
    ASSERT_TRUE(eb.fp8()) << "layer " << l;
    EXPECT_EQ(eb.gate_up[0].dtype(), DType::kF8E4M3);
    EXPECT_EQ(Fp8ExpertValues(eb), ExpertValues(ea)) << "layer " << l;
    // Everything else as the dequantizing load holds it.
    const auto mlp = [](const MlpWeights& w) {
      kernels::ExpertWeights one;
      one.gate_up = {w.gate_up};
      one.down = {w.down};
      return ExpertValues(one);
    };
    EXPECT_EQ(mlp(b->weights().layers[l].moe.shared), mlp(a->weights().layers[l].moe.shared));
  }
  EXPECT_GT(moe_layers, 0);
  const std::vector<int32_t> ids = {3, 17, 900, 4, 4, 250};
  EXPECT_EQ(Logits(*b, ids), Logits(*a, ids));
}

// An FP8 checkpoint in 128 x 128 blocks: its routed experts held as its own codes and scales
// give the model of the dequantized weights, bit for bit; in other block sizes they are held
// dequantized (the FP8 expert kernels read 128 x 128 blocks only).
TEST(Fp8Checkpoint, HeldFp8ExpertsKeepTheFilesCodes) {
  const fs::path dir = fs::temp_directory_path() / ("afd_fp8k_" + std::to_string(::getpid()));
  const ModelConfig config = PresetConfig("tiny");
  const auto backend = kernels::MakeBackend(Device::Cpu());
  const std::vector<int32_t> ids = {3, 17, 900, 4, 4, 250};
  for (const int64_t block : {128, 16}) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    Fp8RecordingSource source(block, block);
    MoeModel direct(config, BuildWeights(config, WeightOptions{}, source), *backend);
    WriteSafetensors((dir / "model.safetensors").string(), source.tensors);
    std::ofstream(dir / "config.json")
        << Fp8Config(config, fmt::format(R"({{"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [{}, {}]}})",
                                         block, block));
    OpenOptions open;
    open.auto_bf16 = false;
    open.weights.keep_fp8_experts = true;
    const auto loaded = OpenModel(dir.string(), open, *backend);
    const int64_t l = config.first_k_dense_replace;
    const kernels::ExpertWeights& e = loaded->weights().layers[l].moe.experts;
    EXPECT_EQ(e.fp8(), block == 128) << "block " << block;
    if (e.fp8()) {
      EXPECT_EQ(Fp8ExpertValues(e), ExpertValues(direct.weights().layers[l].moe.experts));
    }
    EXPECT_EQ(Logits(*loaded, ids), Logits(direct, ids)) << "block " << block;
  }
  fs::remove_all(dir);
}

// moe_layer_freq 2 in config.json: files with dense MLPs between the MoE layers (DeepSeek's own
// code, vLLM) load so; files with experts on every layer (transformers ignores the field) load as
// written; files with neither at such a layer are refused naming the layer and both tensors.
TEST(MoeLayerFreq, TheFilesDecideBetweenTheTwoReadings) {
  const fs::path dir = fs::temp_directory_path() / ("afd_freq_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto backend = kernels::MakeBackend(Device::Cpu());
  const std::vector<int32_t> ids = {3, 17, 900, 4, 4, 250};
  ModelConfig every = PresetConfig("tiny");  // 4 layers, first_k_dense_replace 1
  ModelConfig between = every;
  between.moe_layer_freq = 2;  // layers 1 and 3 dense
  for (const ModelConfig* written : {&between, &every}) {
    RecordingSource source("F32");
    MoeModel direct(*written, BuildWeights(*written, WeightOptions{}, source), *backend);
    WriteSafetensors((dir / "model.safetensors").string(), source.tensors);
    std::ofstream(dir / "config.json") << ConfigJson(between);  // the field says 2 either way
    const auto loaded = OpenModel(dir.string(), OpenOptions{}, *backend);
    EXPECT_EQ(loaded->config().moe_layer_freq, written->moe_layer_freq);
    EXPECT_EQ(PeekModelConfig(dir.string()).moe_layer_freq, written->moe_layer_freq);
    EXPECT_EQ(Logits(*loaded, ids), Logits(direct, ids));
    if (written != &between) continue;
    std::vector<TensorToWrite> without;
    for (const TensorToWrite& t : source.tensors) {
      if (t.name.rfind("model.layers.1.mlp.", 0) != 0) without.push_back(t);
    }
    WriteSafetensors((dir / "model.safetensors").string(), without);
    try {
      OpenModel(dir.string(), OpenOptions{}, *backend);
      ADD_FAILURE() << "no error for a layer with no MLP";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("layer 1 has neither"), std::string::npos) << m;
      EXPECT_NE(m.find("model.layers.1.mlp.gate_proj.weight"), std::string::npos) << m;
      EXPECT_NE(m.find("model.layers.1.mlp.gate.weight"), std::string::npos) << m;
    }
  }
  fs::remove_all(dir);
}

// --kv-cache-dtype: auto is bf16 only for a bf16 model on a GPU (the CPU reference stays exact);
// fp32 and bf16 are taken as given; anything else is refused naming the flag.
TEST(KvCacheDtype, AutoFollowsTheModelOnGpusOnly) {
  const Device cpu = Device::Cpu(), gpu = Device::Cuda(0);
  EXPECT_EQ(ResolveKvCacheDType("auto", DType::kBF16, gpu), DType::kBF16);
  EXPECT_EQ(ResolveKvCacheDType("auto", DType::kF32, gpu), DType::kF32);
  EXPECT_EQ(ResolveKvCacheDType("auto", DType::kBF16, cpu), DType::kF32);
  EXPECT_EQ(ResolveKvCacheDType("bf16", DType::kF32, cpu), DType::kBF16);
  EXPECT_EQ(ResolveKvCacheDType("fp32", DType::kBF16, gpu), DType::kF32);
  try {
    ResolveKvCacheDType("fp8", DType::kBF16, gpu);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype fp8"), std::string::npos) << e.what();
  }
  // OpenModel applies it: a preset opened with a bf16 cache makes bf16 cache shapes.
  kernels::cpu::CpuBackend backend;
  OpenOptions o;
  o.kv_cache_dtype = "bf16";
  EXPECT_EQ(OpenModel("preset:tiny", o, backend)->CacheShape(4).dtype, DType::kBF16);
  EXPECT_EQ(OpenModel("preset:tiny", {}, backend)->CacheShape(4).dtype, DType::kF32);
}

}  // namespace
}  // namespace afd::model

// config.json parsing (legacy rope_scaling and transformers-5 rope_parameters) and the RoPE /
// softmax-scale values it implies, checked against the values in tests/data/golden/README.md.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "afd/common/error.h"
#include "afd/model/loader.h"
#include "afd/model/model_config.h"
#include "afd/model/rope.h"

namespace afd::model {
namespace {

// deepseek-ai/DeepSeek-V2-Lite's config.json (legacy form, as published on the hub).
constexpr const char* kV2LiteJson = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
  "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
  "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400})";

TEST(ModelConfig, LegacyV2LiteMatchesPreset) {
  const ModelConfig c = ParseModelConfig(kV2LiteJson, "config.json");
  const ModelConfig p = PresetConfig("deepseek-v2-lite");
  EXPECT_EQ(c.model_type, ModelType::kDeepseekV2);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{100001});
  for (auto [a, b] : {std::pair{c.vocab_size, p.vocab_size},
                      {c.hidden_size, p.hidden_size},
                      {c.num_hidden_layers, p.num_hidden_layers},
                      {c.n_routed_experts, p.n_routed_experts},
                      {c.moe_intermediate_size, p.moe_intermediate_size},
                      {c.max_position_embeddings, p.max_position_embeddings}}) {
    EXPECT_EQ(a, b);
  }
  EXPECT_EQ(Rope(c).inv_freq(), Rope(p).inv_freq());
  EXPECT_EQ(Rope(c).softmax_scale(), Rope(p).softmax_scale());
}

TEST(ModelConfig, GoldenRopeValues) {
  const std::string dir = std::string(AFD_SOURCE_DIR) + "/tests/data/golden/";
  const ModelConfig v2 = LoadModelConfig(dir + "v2_greedy_yarn/config.json");
  const Rope r2(v2);
  const std::vector<float> expected = {1.0f, 0.05125f, 2.5e-4f, 2.5e-5f};
  ASSERT_EQ(r2.inv_freq().size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(r2.inv_freq()[i], expected[i], 1e-6 * expected[i]);
  EXPECT_FLOAT_EQ(r2.attention_factor(), 1.0f);
  EXPECT_NEAR(r2.softmax_scale(), 0.324481, 1e-6);

  const ModelConfig v3 = LoadModelConfig(dir + "v3_noaux_tc/config.json");
  const Rope r3(v3);
  EXPECT_NEAR(r3.attention_factor(), 1.0569663, 1e-6);
  EXPECT_NEAR(r3.softmax_scale(), 0.342380, 1e-6);
  EXPECT_EQ(v3.topk_method, TopkMethod::kNoauxTc);
  EXPECT_TRUE(v3.rope_interleave);
  EXPECT_TRUE(v3.norm_topk_prob);

  const ModelConfig v3s = LoadModelConfig(dir + "v3_sharded/config.json");
  EXPECT_FALSE(v3s.rope_interleave);
  EXPECT_NEAR(Rope(v3s).softmax_scale(), 0.204124, 1e-6);
}

TEST(ModelConfig, ErrorsNameTheProblem) {
  auto message = [](const std::string& text) {
    try {
      ParseModelConfig(text, "cfg.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("cfg.json is not valid JSON"), std::string::npos);
  EXPECT_NE(message(R"({"model_type": "llama"})").find("llama"), std::string::npos);
  std::string text = kV2LiteJson;
  text.replace(text.find("\"greedy\""), 8, "\"noaux_tc\"");
  EXPECT_NE(message(text).find("topk_method"), std::string::npos);
  text = kV2LiteJson;
  text.replace(text.find("\"yarn\""), 6, "\"dynamic\"");
  EXPECT_NE(message(text).find("dynamic"), std::string::npos);
  text = kV2LiteJson;
  text.replace(text.find("\"num_experts_per_tok\": 6"), 24, "\"num_experts_per_tok\": 65");
  EXPECT_NE(message(text).find("num_experts_per_tok"), std::string::npos);
}

// moe_layer_freq: MoE from first_k_dense_replace on where layer % freq == 0 (DeepSeek's code,
// vLLM); null or absent is 1; dense layers between need an intermediate_size.
TEST(ModelConfig, MoeLayerFreqMakesTheLayersBetweenDense) {
  auto with = [](std::vector<std::pair<std::string, std::string>> edits) {
    std::string text = kV2LiteJson;
    for (const auto& [from, to] : edits) {
      const size_t at = text.find(from);
      EXPECT_NE(at, std::string::npos) << from;
      if (at != std::string::npos) text.replace(at, from.size(), to);
    }
    return text;
  };
  const ModelConfig c =
      ParseModelConfig(with({{"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 3"}}), "cfg.json");
  EXPECT_EQ(c.moe_layer_freq, 3);
  std::vector<int64_t> moe;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.IsMoeLayer(l)) moe.push_back(l);
  }
  EXPECT_EQ(moe, (std::vector<int64_t>{3, 6, 9, 12, 15, 18, 21, 24}));
  EXPECT_EQ(c.MoeLayers(), (std::vector<int>{3, 6, 9, 12, 15, 18, 21, 24}));
  EXPECT_EQ(c.num_moe_layers(), 8);
  EXPECT_EQ(
      ParseModelConfig(with({{"\"moe_layer_freq\": 1", "\"moe_layer_freq\": null"}}), "cfg.json")
          .moe_layer_freq,
      1);
  EXPECT_EQ(ParseModelConfig(with({{"\"moe_layer_freq\": 1,", ""}}), "cfg.json").moe_layer_freq, 1);
  // No dense layer before the MoE ones, but dense ones between: intermediate_size is needed.
  const std::vector<std::pair<std::string, std::string>> no_dense = {
      {"\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 0"},
      {"\"intermediate_size\": 10944", "\"intermediate_size\": 0"}};
  EXPECT_NO_THROW(ParseModelConfig(with(no_dense), "cfg.json"));
  auto between = no_dense;
  between.push_back({"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2"});
  try {
    ParseModelConfig(with(between), "cfg.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, MemoryCheckCountsOnlyWhatARoleLoads) {
  const ModelConfig c = PresetConfig("deepseek-v2-lite");
  WeightOptions all;
  const int64_t whole = LoadedParameterCount(c, all);
  EXPECT_NEAR(static_cast<double>(whole), static_cast<double>(ParameterCount(c)), 1.0);
  WeightOptions ffn;  // an FFN rank of 8: routers, shared experts, 8 of 64 routed experts
  ffn.load_attention = false;
  ffn.expert_begin = 0;
  ffn.expert_end = 8;
  WeightOptions attention;  // attention without any expert
  attention.load_moe = false;
  attention.expert_end = 0;
  const int64_t f = LoadedParameterCount(c, ffn), a = LoadedParameterCount(c, attention);
  EXPECT_LT(f, whole / 4);
  EXPECT_LT(a, whole / 4);
  WeightOptions ffn_rest = ffn;
  ffn_rest.load_moe = false;
  ffn_rest.expert_begin = 8;
  ffn_rest.expert_end = 64;
  // Attention + every FFN part (routers and shared counted once) = the whole model.
  EXPECT_EQ(a + f + LoadedParameterCount(c, ffn_rest), whole);
}

TEST(ModelConfig, UntrustedValuesAreRejectedNamingTheField) {
  auto message = [](const std::string& from, const std::string& to) {
    std::string text = kV2LiteJson;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    try {
      ParseModelConfig(text, "cfg.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  struct Case {
    std::string from, to, needle;
  };
  const std::vector<Case> cases = {
      // 1.5 (or 2.0) is not an integer: no silent truncation.
      {"\"hidden_size\": 2048", "\"hidden_size\": 2048.5",
       "cfg.json: \"hidden_size\": must be an integer"},
      {"\"n_routed_experts\": 64", "\"n_routed_experts\": 64.0",
       "cfg.json: \"n_routed_experts\": must be an integer"},
      {"\"n_group\": 1", "\"n_group\": 1.5", "cfg.json: \"n_group\": must be an integer"},
      {"\"hidden_size\": 2048", "\"hidden_size\": \"2048\"", "\"hidden_size\": must be an integer"},
      {"\"hidden_size\": 2048", "\"hidden_size\": 18446744073709551615", "\"hidden_size\""},
      {"\"hidden_size\": 2048", "\"hidden_size\": 4194304",
       "\"hidden_size\" must be in 1..1048576"},
      {"\"vocab_size\": 102400", "\"vocab_size\": -1", "\"vocab_size\" must be in 1..1048576"},
      {"\"num_hidden_layers\": 27", "\"num_hidden_layers\": 100000", "num_hidden_layers"},
      {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e300", "rms_norm_eps"},
      {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": true", "\"rms_norm_eps\": must be a number"},
      {"\"eos_token_id\": 100001", "\"eos_token_id\": [100001, 1.5]",
       "cfg.json: \"eos_token_id\"[1]: must be an integer"},
      {"\"rope_theta\": 10000", "\"rope_theta\": -5", "rope_theta must be a finite number > 0"},
      {"\"norm_topk_prob\": false", "\"norm_topk_prob\": 0",
       "\"norm_topk_prob\" must be a boolean"},
      {"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 0", "\"moe_layer_freq\" must be in 1..4096"},
      {"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 1.5",
       "cfg.json: \"moe_layer_freq\": must be an integer"},
      // A key twice: which value wins is not the file's author's guess to make.
      {"\"hidden_size\": 2048", "\"hidden_size\": 2048, \"hidden_size\": 4096",
       "key \"hidden_size\" appears more than once"},
  };
  for (const Case& c : cases) {
    const std::string m = message(c.from, c.to);
    EXPECT_NE(m.find(c.needle), std::string::npos) << c.to << " -> " << m;
  }
}

}  // namespace
}  // namespace afd::model

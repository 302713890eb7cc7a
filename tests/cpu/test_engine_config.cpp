// config.json parsing: transformers 4.x and 5.x spellings, --hf-overrides, rejections naming the field.
#include <gtest/gtest.h>

#include <string>

#include "engine/config.h"
#include "cpu/engine_test_util.h"
#include "cpu/formats_test_util.h"
#include "megamoe/error.h"

using namespace megamoe;
using namespace megamoe::engine;
using nlohmann::json;

namespace {

using megamoe::engine::testing::fixture;

// Expects parse_model_config(config) to throw an Error whose message contains every `needle`.
void expect_rejected(const json& config, const std::vector<std::string>& needles) {
  megamoe::test::expect_error_mentions([&] { parse_model_config(config); }, needles);
}

json qwen_v5() { return read_json_file(fixture("tiny-qwen3-moe") + "/config.json"); }

TEST(EngineConfig, Qwen3MoeFixture) {
  const ModelConfig c = parse_model_config(qwen_v5());
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);  // explicit, != hidden / heads
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_TRUE(c.router.renormalize);
  EXPECT_EQ(c.router.kind, RouterKind::kSoftmaxTopK);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_TRUE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));  // mlp_only_layers
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_EQ(c.checkpoint_dtype, DType::kBF16);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2045});
}

// The field sets of the published Qwen3-30B-A3B and Mixtral-8x7B configs parse as they are.
TEST(EngineConfig, FullSizeConfigs) {
  const ModelConfig qwen = parse_model_config(json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})"));
  EXPECT_EQ(qwen.num_layers, 48);
  EXPECT_EQ(qwen.q_size(), 4096);
  EXPECT_EQ(qwen.kv_size(), 512);
  EXPECT_EQ(qwen.num_experts, 128);
  EXPECT_EQ(qwen.top_k, 8);
  EXPECT_EQ(qwen.moe_intermediate_size, 768);
  EXPECT_TRUE(qwen.is_moe_layer(47));
  const ModelConfig mixtral = parse_model_config(json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})"));
  EXPECT_EQ(mixtral.head_dim, 128);
  EXPECT_EQ(mixtral.moe_intermediate_size, 14336);
}

TEST(EngineConfig, TransformersV4AndV5SpellingsAgree) {
  json v4 = qwen_v5();
  v4.erase("rope_parameters");
  v4.erase("dtype");
  v4["rope_theta"] = 1e6;
  v4["rope_scaling"] = nullptr;
  v4["torch_dtype"] = "bfloat16";
  v4["transformers_version"] = "4.51.0";
  json v5_renamed = qwen_v5();
  v5_renamed.erase("num_experts");
  v5_renamed["num_local_experts"] = 8;  // transformers 5 writes num_experts as num_local_experts
  for (const json& config : {v4, v5_renamed}) {
    const ModelConfig c = parse_model_config(config);
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_EQ(c.checkpoint_dtype, DType::kBF16);
  }
  const ModelConfig mixtral = load_model_config(fixture("tiny-mixtral"));  // v4 spelling on disk
  EXPECT_EQ(mixtral.model_type, "mixtral");
  EXPECT_EQ(mixtral.head_dim, 16);  // hidden / heads
  EXPECT_FALSE(mixtral.qk_norm);
  EXPECT_TRUE(mixtral.router.renormalize);
  EXPECT_TRUE(mixtral.tie_word_embeddings);
  EXPECT_EQ(mixtral.moe_intermediate_size, 48);
  for (int layer = 0; layer < mixtral.num_layers; ++layer) EXPECT_TRUE(mixtral.is_moe_layer(layer));
}

TEST(EngineConfig, DecoderSparseStep) {
  json config = qwen_v5();
  config["decoder_sparse_step"] = 2;
  config["mlp_only_layers"] = json::array();
  const ModelConfig c = parse_model_config(config);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(2));
  config.erase("intermediate_size");
  expect_rejected(config, {"intermediate_size", "dense"});
}

TEST(EngineConfig, HfOverridesMergeRecursively) {
  const ModelConfig c = load_model_config(fixture("tiny-qwen3-moe"),
                                          R"({"num_hidden_layers": 1, "rope_parameters": {"rope_theta": 5000.0}})");
  EXPECT_EQ(c.num_layers, 1);
  EXPECT_EQ(c.rope_theta, 5000.0);
  const json merged = merge_hf_overrides(json{{"a", {{"b", 1}, {"c", 2}}}}, json{{"a", {{"c", 3}}}, {"d", nullptr}});
  EXPECT_EQ(merged, (json{{"a", {{"b", 1}, {"c", 3}}}, {"d", nullptr}}));
  EXPECT_THROW(load_model_config(fixture("tiny-qwen3-moe"), "{not json"), Error);
  EXPECT_THROW(load_model_config(fixture("tiny-qwen3-moe"), "[1, 2]"), Error);
}

TEST(EngineConfig, UnsupportedFieldsAndValuesAreRejectedByName) {
  json c;
  c = qwen_v5(); c["model_type"] = "llama";                 expect_rejected(c, {"model_type", "llama"});
  c = qwen_v5(); c["rope_parameters"]["rope_type"] = "yarn"; expect_rejected(c, {"rope_parameters.rope_type", "yarn"});
  c = qwen_v5(); c.erase("rope_parameters"); c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  expect_rejected(c, {"rope_scaling"});
  c = qwen_v5(); c["dtype"] = "float8";                     expect_rejected(c, {"dtype", "float8"});
  c = qwen_v5(); c["use_sliding_window"] = true;            expect_rejected(c, {"use_sliding_window"});
  c = qwen_v5(); c["attention_bias"] = true;                expect_rejected(c, {"attention_bias"});
  c = qwen_v5(); c["hidden_act"] = "gelu";                  expect_rejected(c, {"hidden_act", "gelu"});
  c = qwen_v5(); c["quantization_config"] = {{"quant_method", "gptq"}};
  expect_rejected(c, {"quantization_config.quant_method", "gptq"});
  c = qwen_v5(); c["quantization_config"] = {{"quant_method", "fp8"}};
  expect_rejected(c, {"quantization_config.weight_block_size", "missing"});
  c = qwen_v5(); c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}};
  expect_rejected(c, {"quantization_config.weight_block_size", "[64,64]"});
  c = qwen_v5(); c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}},
                                             {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}};
  EXPECT_EQ(parse_model_config(c).checkpoint_format, WeightFormat::kFp8Block);
  EXPECT_EQ(parse_model_config(qwen_v5()).checkpoint_format, WeightFormat::kBf16);
  c = qwen_v5(); c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}};
  EXPECT_EQ(parse_model_config(c).checkpoint_format, WeightFormat::kNvfp4);
  c["quantization_config"]["quant_algo"] = "FP8";
  expect_rejected(c, {"quantization_config.quant_algo", "FP8"});
  c = qwen_v5(); c["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}};
  EXPECT_EQ(parse_model_config(c).checkpoint_format, WeightFormat::kMxfp4);
  c["quantization_config"]["format"] = "pack-quantized";
  expect_rejected(c, {"quantization_config.format", "pack-quantized"});
  c = qwen_v5(); c["shared_expert_intermediate_size"] = 128; expect_rejected(c, {"shared_expert_intermediate_size"});
  c = qwen_v5(); c["num_key_value_heads"] = 3;              expect_rejected(c, {"num_key_value_heads", "3"});
  c = qwen_v5(); c["num_experts_per_tok"] = 9;              expect_rejected(c, {"num_experts_per_tok", "9"});
  c = qwen_v5(); c["hidden_size"] = -64;                    expect_rejected(c, {"hidden_size", "-64"});
  c = qwen_v5(); c.erase("vocab_size");                     expect_rejected(c, {"vocab_size", "missing"});
  c = qwen_v5(); c["mlp_only_layers"] = {-1};               expect_rejected(c, {"mlp_only_layers", "-1"});
  c = qwen_v5(); c["some_new_knob"] = 3;                    expect_rejected(c, {"some_new_knob"});
  c = qwen_v5(); c["some_new_knob"] = nullptr;              EXPECT_NO_THROW(parse_model_config(c));
  c = read_json_file(fixture("tiny-mixtral") + "/config.json");
  c["sliding_window"] = 4096;                               expect_rejected(c, {"sliding_window", "4096"});
}

}  // namespace

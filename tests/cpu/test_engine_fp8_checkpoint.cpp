// Pre-quantized FP8 block checkpoints (DeepSeek / Qwen3-FP8 convention: E4M3 `weight` +
// `weight_scale_inv` per 128x128): dense layers are dequantized, experts go to the backend unchanged.
// Oracle: the same model written as F32 values of the dequantized weights, experts quantized online.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/model.h"
#include "cpu/engine_test_util.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

using namespace megamoe;
using namespace megamoe::engine;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using megamoe::engine::testing::fixture;

using megamoe::engine::testing::RawSafetensor;
using megamoe::engine::testing::compare;

RawSafetensor f32_tensor(const std::string& name, const std::vector<float>& values, std::vector<int64_t> shape) {
  RawSafetensor t{name, "F32", std::move(shape), std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

class EngineFp8Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("megamoe_engine_fp8_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "fp8");
    fs::create_directories(root_ / "f32");
    // tiny-qwen3-moe's layout at a 128-multiple geometry (FP8 blocks are 128x128).
    json config = read_json_file(fixture("tiny-qwen3-moe") + "/config.json");
    config["hidden_size"] = 128;
    config["moe_intermediate_size"] = 128;
    config["intermediate_size"] = 256;
    std::ofstream(root_ / "f32" / "config.json") << config.dump();
    config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}},
                                     {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}};
    std::ofstream(root_ / "fp8" / "config.json") << config.dump();
    const ModelConfig c = parse_model_config(config);

    seed_ = std::random_device{}();
    std::mt19937 rng(seed_);
    std::vector<RawSafetensor> fp8, f32;
    auto random = [&](int64_t count, double std, double mean) {
      std::normal_distribution<float> normal(static_cast<float>(mean), static_cast<float>(std));
      std::vector<float> v(count);
      for (float& x : v) x = normal(rng);
      return v;
    };
    auto plain = [&](const std::string& name, std::vector<int64_t> shape, double std, double mean = 0.0) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      const RawSafetensor t = f32_tensor(name, random(n, std, mean), shape);
      fp8.push_back(t);
      f32.push_back(t);
    };
    // FP8 in one file; the dequantized F32 values in the other.
    auto quantized = [&](const std::string& name, int64_t rows, int64_t cols) {
      const std::vector<float> w = random(rows * cols, 1.0 / std::sqrt(static_cast<double>(cols)), 0.0);
      const formats::QuantizedMatrix q = formats::quantize(w.data(), rows, cols, WeightFormat::kFp8Block);
      fp8.push_back(RawSafetensor{name, "F8_E4M3", {rows, cols}, q.data});
      fp8.push_back(f32_tensor(name + "_scale_inv", q.block_scales, {(rows + 127) / 128, (cols + 127) / 128}));
      f32.push_back(f32_tensor(name, formats::dequantize(q), {rows, cols}));
    };
    const int64_t H = c.hidden_size, V = c.vocab_size, D = c.head_dim, I = c.moe_intermediate_size;
    plain("model.embed_tokens.weight", {V, H}, 1.0);
    plain("model.norm.weight", {H}, 0.1, 1.0);
    plain("lm_head.weight", {V, H}, 2.0 / std::sqrt(static_cast<double>(H)));
    for (int layer = 0; layer < c.num_layers; ++layer) {
      const std::string p = "model.layers." + std::to_string(layer) + ".";
      plain(p + "input_layernorm.weight", {H}, 0.1, 1.0);
      plain(p + "post_attention_layernorm.weight", {H}, 0.1, 1.0);
      plain(p + "self_attn.q_norm.weight", {D}, 0.1, 1.0);
      plain(p + "self_attn.k_norm.weight", {D}, 0.1, 1.0);
      quantized(p + "self_attn.q_proj.weight", c.q_size(), H);
      quantized(p + "self_attn.k_proj.weight", c.kv_size(), H);
      quantized(p + "self_attn.v_proj.weight", c.kv_size(), H);
      quantized(p + "self_attn.o_proj.weight", H, c.q_size());
      if (!c.is_moe_layer(layer)) {
        quantized(p + "mlp.gate_proj.weight", c.intermediate_size, H);
        quantized(p + "mlp.up_proj.weight", c.intermediate_size, H);
        quantized(p + "mlp.down_proj.weight", H, c.intermediate_size);
        continue;
      }
      plain(p + "mlp.gate.weight", {c.num_experts, H}, 2.0 / std::sqrt(static_cast<double>(H)));
      for (int e = 0; e < c.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        quantized(x + "gate_proj.weight", I, H);
        quantized(x + "up_proj.weight", I, H);
        quantized(x + "down_proj.weight", H, I);
      }
    }
    megamoe::engine::testing::write_safetensors((root_ / "fp8" / "model.safetensors").string(), fp8);
    megamoe::engine::testing::write_safetensors((root_ / "f32" / "model.safetensors").string(), f32);
  }
  void TearDown() override { fs::remove_all(root_); }

  static std::vector<float> logits(ModelRunner& runner) {
    StepBatch batch;
    SequenceChunk& chunk = batch.chunks.emplace_back();
    chunk.tokens = {3, 1500, 42, 42, 977, 2047, 0, 612, 88};
    chunk.block_table = {0, 1, 2};
    return runner.step(batch).logits.at(0);
  }

  fs::path root_;
  uint32_t seed_ = 0;
};

TEST_F(EngineFp8Checkpoint, MatchesTheDequantizedModelWithOnlineFp8Experts) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  RunnerOptions options;
  options.load.progress = false;
  options.num_kv_blocks = 4;
  options.kv_block_size = 4;
  const std::vector<float> from_fp8 = logits(*make_cpu_model_runner((root_ / "fp8").string(), options));
  options.load.quantization = WeightFormat::kFp8Block;
  const std::vector<float> from_f32 = logits(*make_cpu_model_runner((root_ / "f32").string(), options));
  const auto c = compare(from_fp8, from_f32);
  const double rel_l2 = c.rel_l2, max_abs = c.max_abs, ref_max = c.ref_max;
  std::printf("fp8 checkpoint vs dequantized f32 + online fp8: rel_l2 %.3g, max |diff| %.3g (max |ref| %.3g)\n",
              rel_l2, max_abs, ref_max);
  // Dense weights are the same fp32 values; online requantization of dequantized experts reproduces
  // the codes, with scales at most an ulp apart.
  EXPECT_LT(rel_l2, 1e-4);
  EXPECT_LT(max_abs, 1e-4 * ref_max);
}

TEST_F(EngineFp8Checkpoint, RequantizingIsRejected) {
  RunnerOptions options;
  options.load.progress = false;
  options.load.quantization = WeightFormat::kNvfp4;
  try {
    make_cpu_model_runner((root_ / "fp8").string(), options);
    ADD_FAILURE() << "expected megamoe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--quantization nvfp4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp8_block"), std::string::npos) << e.what();
  }
}

}  // namespace

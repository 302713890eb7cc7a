// Pre-quantized checkpoints in each convention of docs/formats.md (FP8 block `weight_scale_inv`,
// ModelOpt NVFP4, compressed-tensors NVFP4 and MXFP4): dense layers are dequantized, experts go to
// the backend unchanged. Oracle: the same model written as F32 values of the dequantized weights,
// with experts quantized online to the same format (which reproduces the codes and scales).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/weights.h"
#include "cpu/engine_test_util.h"
#include "megamoe/error.h"
#include "megamoe/checkpoint.h"
#include "megamoe/formats.h"

using namespace megamoe;
using namespace megamoe::engine;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using megamoe::engine::testing::fixture;

using megamoe::engine::testing::RawSafetensor;
using megamoe::engine::testing::compare;
using megamoe::engine::testing::expect_same_matrix;

RawSafetensor f32_tensor(const std::string& name, const std::vector<float>& values, std::vector<int64_t> shape) {
  RawSafetensor t{name, "F32", std::move(shape), std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

struct Convention {
  const char* name;
  WeightFormat format;
  json quantization_config;
};

const Convention kConventions[] = {
    {"fp8_block", WeightFormat::kFp8Block,
     {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}}},
    {"modelopt_nvfp4", WeightFormat::kNvfp4,
     {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"lm_head"}}}},
    {"compressed_tensors_nvfp4", WeightFormat::kNvfp4,
     {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"}, {"ignore", {"lm_head"}}}},
    {"compressed_tensors_mxfp4", WeightFormat::kMxfp4,
     {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}, {"ignore", {"lm_head"}}}},
};

// Appends the tensors of linear `name` (".weight" suffix included) stored in `convention`.
void append_quantized(std::vector<RawSafetensor>& out, const std::string& name, const formats::QuantizedMatrix& q,
                      const Convention& convention) {
  const std::string base = name.substr(0, name.size() - std::string(".weight").size());
  const int64_t rows = q.rows, cols = q.cols;
  switch (q.format) {
    case WeightFormat::kFp8Block:
      out.push_back({name, "F8_E4M3", {rows, cols}, q.data});
      out.push_back(f32_tensor(name + "_scale_inv", q.block_scales, {(rows + 127) / 128, (cols + 127) / 128}));
      return;
    case WeightFormat::kNvfp4:
      if (std::string(convention.name) == "modelopt_nvfp4") {
        out.push_back({name, "U8", {rows, cols / 2}, q.data});
        out.push_back({name + "_scale", "F8_E4M3", {rows, cols / 16}, q.group_scales});
        out.push_back(f32_tensor(name + "_scale_2", {q.global_scales[0]}, {}));
      } else {
        out.push_back({base + ".weight_packed", "U8", {rows, cols / 2}, q.data});
        out.push_back({base + ".weight_scale", "F8_E4M3", {rows, cols / 16}, q.group_scales});
        out.push_back(f32_tensor(base + ".weight_global_scale", {1.0f / q.global_scales[0]}, {1}));
      }
      return;
    case WeightFormat::kMxfp4:
      out.push_back({base + ".weight_packed", "U8", {rows, cols / 2}, q.data});
      out.push_back({base + ".weight_scale", "U8", {rows, cols / 32}, q.group_scales});
      return;
    default:
      FAIL() << "not a quantized format";
  }
}

class EngineQuantizedCheckpoint : public ::testing::TestWithParam<Convention> {
 protected:
  void SetUp() override {
    const Convention& convention = GetParam();
    root_ = fs::temp_directory_path() /
            ("megamoe_engine_" + std::string(convention.name) + "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "quantized");
    fs::create_directories(root_ / "f32");
    // tiny-qwen3-moe's layout at a 128-multiple geometry (FP8 blocks are 128x128).
    json config = read_json_file(fixture("tiny-qwen3-moe") + "/config.json");
    config["hidden_size"] = 128;
    config["moe_intermediate_size"] = 128;
    config["intermediate_size"] = 256;
    std::ofstream(root_ / "f32" / "config.json") << config.dump();
    config["quantization_config"] = convention.quantization_config;
    std::ofstream(root_ / "quantized" / "config.json") << config.dump();
    const ModelConfig c = parse_model_config(config);

    seed_ = std::random_device{}();
    std::mt19937 rng(seed_);
    std::vector<RawSafetensor> quantized_file, f32;
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
      quantized_file.push_back(t);
      f32.push_back(t);
    };
    // Quantized in one file; the dequantized F32 values in the other.
    auto quantized = [&](const std::string& name, int64_t rows, int64_t cols) {
      const std::vector<float> w = random(rows * cols, 1.0 / std::sqrt(static_cast<double>(cols)), 0.0);
      // compressed-tensors NVFP4 stores the normalisation fp32(1/global); reading it back gives the
      // global within an ulp.
      const formats::QuantizedMatrix q = formats::quantize(w.data(), rows, cols, convention.format);
      append_quantized(quantized_file, name, q, convention);
      written_[name] = q;
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
    megamoe::engine::testing::write_safetensors((root_ / "quantized" / "model.safetensors").string(), quantized_file);
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
  std::map<std::string, formats::QuantizedMatrix> written_;  // quantized linears, by checkpoint name
};

TEST_P(EngineQuantizedCheckpoint, MatchesTheDequantizedModelWithOnlineQuantizedExperts) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  RunnerOptions options;
  options.load.progress = false;
  options.num_kv_blocks = 4;
  options.kv_block_size = 4;
  const std::vector<float> from_quantized = logits(*make_cpu_model_runner((root_ / "quantized").string(), options));
  options.load.quantization = GetParam().format;
  const std::vector<float> from_f32 = logits(*make_cpu_model_runner((root_ / "f32").string(), options));
  const auto c = compare(from_quantized, from_f32);
  const double rel_l2 = c.rel_l2, max_abs = c.max_abs, ref_max = c.ref_max;
  std::printf("%s checkpoint vs dequantized f32 + online: rel_l2 %.3g, max |diff| %.3g (max |ref| %.3g)\n",
              GetParam().name, rel_l2, max_abs, ref_max);
  // Dense weights are the same fp32 values. FP8 / MXFP4: online requantization of the dequantized
  // experts reproduces the codes and scales (bit-exact so far). NVFP4: the checkpoint's gate and up
  // each have their own global while online quantization of W13 uses one, so codes differ and only
  // quantization-noise agreement is expected here; LoaderReturnsTheWrittenMatrices is the exact check.
  // Measured over 80 fresh seeds (2026-11-30): rel-L2 0.011-0.04, and once 0.23 -- the two
  // quantizations' noise flipped a top-2 expert of some token (a near tie of the router); CI saw
  // 0.185 once against the former bound 0.1. The NVFP4 bound allows such a flip.
  const double bound = GetParam().format == WeightFormat::kNvfp4 ? 0.3 : 1e-4;
  EXPECT_LT(rel_l2, bound);
  EXPECT_LT(max_abs, bound * ref_max * 10);
}

TEST_P(EngineQuantizedCheckpoint, LoaderReturnsTheWrittenMatrices) {
  const std::string dir = (root_ / "quantized").string();
  const ModelConfig config = load_model_config(dir);
  EXPECT_EQ(config.checkpoint_format, GetParam().format);
  const auto source = make_checkpoint_source(config, dir);
  int experts = 0;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    // Dense: the dequantized values.
    const std::string q_proj = p + "self_attn.q_proj.weight";
    const std::vector<float> got = source->dense(q_proj, {config.q_size(), config.hidden_size});
    const std::vector<float> want = formats::dequantize(written_.at(q_proj));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 2.4e-7 * std::abs(want[i])) << q_proj << " " << i;
    if (!config.is_moe_layer(layer)) continue;
    for (int e = 0; e < config.num_experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      const ExpertWeights w = source->expert(layer, e, GetParam().format);
      SCOPED_TRACE(x);
      expect_same_matrix(w.w13, formats::fuse_w13(written_.at(x + "gate_proj.weight"), written_.at(x + "up_proj.weight")),
                         1.2e-7);
      expect_same_matrix(w.w2, written_.at(x + "down_proj.weight"), 1.2e-7);
      ++experts;
    }
  }
  EXPECT_EQ(experts, 2 * config.num_experts);
}

TEST_P(EngineQuantizedCheckpoint, RequantizingIsRejected) {
  RunnerOptions options;
  options.load.progress = false;
  const WeightFormat other = GetParam().format == WeightFormat::kNvfp4 ? WeightFormat::kMxfp4 : WeightFormat::kNvfp4;
  options.load.quantization = other;
  try {
    make_cpu_model_runner((root_ / "quantized").string(), options);
    ADD_FAILURE() << "expected megamoe::Error";
  } catch (const Error& e) {
    const std::string want = "--quantization " + std::string(weight_format_name(other));
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(weight_format_name(GetParam().format)), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Conventions, EngineQuantizedCheckpoint, ::testing::ValuesIn(kConventions),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace

// Checkpoint conventions -> canonical QuantizedMatrix: worked numbers (the same as docs/formats.md),
// W13 fusion, gpt-oss layouts and bad-input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "megamoe/checkpoint.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"
#include "cpu/formats_test_util.h"

using namespace megamoe;
using namespace megamoe::formats;
using megamoe::test::expect_error_mentions;

namespace {

template <typename T>
RawTensor raw(DType dtype, std::vector<int64_t> shape, const std::vector<T>& data, std::string name = "") {
  RawTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = data.data();
  t.name = std::move(name);
  return t;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed, uint8_t avoid_mask = 0) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    b = static_cast<uint8_t>(rng());
    if (avoid_mask && (b & avoid_mask) == avoid_mask) b ^= 0x01;  // e.g. avoid E4M3 NaN 0x7F/0xFF
  }
  return v;
}

}  // namespace

// ---- NVFP4 alphas: the worked example ---------------------------------------------------------

TEST(FormatsCheckpoint, CompressedTensorsFc1AlphasWorkedExample) {
  // input_global_scale 135, weight_global_scale 2 (gate) and 4 (up): normalisations, so
  // alpha = 1 / (135 * 2) = 1/270 and 1 / (135 * 4) = 1/540.
  const std::array<float, 2> a = nvfp4_fc1_alphas(135.0f, {2.0f, 4.0f}, Nvfp4ScaleConvention::kCompressedTensors);
  EXPECT_EQ(a[0], static_cast<float>(1.0 / 270.0));
  EXPECT_EQ(a[1], static_cast<float>(1.0 / 540.0));
  EXPECT_EQ(a[0], 0.0037037036f);
  EXPECT_EQ(a[1], 0.0018518518f);
  // The same model in ModelOpt's convention stores dequant factors: input 1/135, weights 1/2, 1/4.
  const std::array<float, 2> m = nvfp4_fc1_alphas(1.0f / 135.0f, {0.5f, 0.25f}, Nvfp4ScaleConvention::kModelOpt);
  EXPECT_NEAR(m[0], a[0], 1e-9);
  EXPECT_NEAR(m[1], a[1], 1e-9);
  EXPECT_EQ(nvfp4_fc1_alphas(0.5f, {0.25f, 0.125f}, Nvfp4ScaleConvention::kModelOpt), (std::array<float, 2>{0.125f, 0.0625f}));
  EXPECT_EQ(nvfp4_dequant_factor(4.0f, Nvfp4ScaleConvention::kCompressedTensors), 0.25f);
  EXPECT_EQ(nvfp4_dequant_factor(3.0f, Nvfp4ScaleConvention::kCompressedTensors), static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(nvfp4_dequant_factor(3.0f, Nvfp4ScaleConvention::kModelOpt), 3.0f);
  expect_error_mentions([] { nvfp4_fc1_alphas(0.0f, {1.0f, 1.0f}, Nvfp4ScaleConvention::kCompressedTensors); },
                        {"input scale", "finite and > 0"});
  expect_error_mentions([] { nvfp4_fc1_alphas(1.0f, {1.0f, NAN}, Nvfp4ScaleConvention::kModelOpt); },
                        {"up weight global"});
  const std::vector<float> input{135.0f};
  EXPECT_EQ(nvfp4_input_dequant_factor(raw(DType::kF32, {1}, input), Nvfp4ScaleConvention::kCompressedTensors),
            static_cast<float>(1.0 / 135.0));
  const std::vector<float> two{1.0f, 2.0f};
  expect_error_mentions([&] { nvfp4_input_dequant_factor(raw(DType::kF32, {2}, two, "l.input_scale"), Nvfp4ScaleConvention::kModelOpt); },
                        {"input_scale 'l.input_scale'", "[2]"});
}

// ---- NVFP4 checkpoints ------------------------------------------------------------------------------------

TEST(FormatsCheckpoint, ModelOptNvfp4WorkedNumbers) {
  // One expert's projection, N = 2, K = 16.
  // Row 0 bytes: 0x2A -> k0 = code 0xA = -1.0, k1 = code 0x2 = 1.0; the rest 0x00.
  // Row 1 bytes: 0x7F -> k0 = code 0xF = -6.0, k1 = code 0x7 = 6.0.
  std::vector<uint8_t> weight(2 * 8, 0);
  weight[0] = 0x2A;
  weight[8] = 0x7F;
  const std::vector<uint8_t> weight_scale{0x40, 0x3C};  // E4M3 2.0 and 1.5
  const std::vector<float> weight_scale_2{0.5f};        // dequant factor
  const QuantizedMatrix m = from_modelopt_nvfp4(raw(DType::kU8, {2, 8}, weight), raw(DType::kFP8E4M3, {2, 1}, weight_scale),
                                                raw(DType::kF32, {}, weight_scale_2));
  EXPECT_EQ(m.format, WeightFormat::kNvfp4);
  EXPECT_EQ(m.rows, 2);
  EXPECT_EQ(m.cols, 16);
  EXPECT_EQ(m.global_scales, (std::array<float, 2>{0.5f, 0.5f}));
  const std::vector<float> d = dequantize(m);
  EXPECT_EQ(d[0], -1.0f);   // -1 * 2.0 * 0.5
  EXPECT_EQ(d[1], 1.0f);    //  1 * 2.0 * 0.5
  EXPECT_EQ(d[2], 0.0f);
  EXPECT_EQ(d[16], -4.5f);  // -6 * 1.5 * 0.5
  EXPECT_EQ(d[17], 4.5f);

  // The same bytes as compressed-tensors with weight_global_scale 2 (normalisation) are the same matrix.
  const std::vector<float> global_scale{2.0f};
  const QuantizedMatrix c = from_compressed_tensors_nvfp4(
      raw(DType::kU8, {2, 8}, weight), raw(DType::kFP8E4M3, {2, 1}, weight_scale), raw(DType::kF32, {1}, global_scale));
  EXPECT_EQ(c.global_scales, m.global_scales);
  EXPECT_EQ(dequantize(c), d);
  // Global 3: dequant factor fp32(1/3); the value is fp32(code * scale * fp32(1/3)).
  const std::vector<float> three{3.0f};
  const QuantizedMatrix t = from_compressed_tensors_nvfp4(
      raw(DType::kU8, {2, 8}, weight), raw(DType::kFP8E4M3, {2, 1}, weight_scale), raw(DType::kF32, {1}, three));
  EXPECT_EQ(dequantize(t)[16], static_cast<float>(-6.0 * 1.5 * static_cast<double>(static_cast<float>(1.0 / 3.0))));
  EXPECT_EQ(dequantize(t)[16], -3.0f);
}

TEST(FormatsCheckpoint, ModelOptFusedW13WithTwoGlobalsIsExactPerHalf) {
  const int64_t n = 8, k = 32;
  const std::vector<uint8_t> weight = random_bytes(n * k / 2, 1);
  const std::vector<uint8_t> scales = random_bytes(n * k / 16, 2, 0x7F);
  const std::vector<float> globals{0.5f, 0.0625f};
  const QuantizedMatrix m = from_modelopt_nvfp4(raw(DType::kU8, {n, k / 2}, weight), raw(DType::kU8, {n, k / 16}, scales),
                                                raw(DType::kF32, {2}, globals));
  EXPECT_EQ(m.global_scales, (std::array<float, 2>{0.5f, 0.0625f}));
  // The same through a stacked [E, 2] weight_scale_2 and an [E] input_scale (as vLLM fuses them).
  const std::vector<float> stacked_globals{1.0f, 1.0f, 0.5f, 0.0625f}, input_scales{0.25f, 0.125f};
  const RawTensor ws2 = slice_expert(raw(DType::kF32, {2, 2}, stacked_globals, "w13_weight_scale_2"), 1);
  EXPECT_EQ(ws2.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(ws2.name, "w13_weight_scale_2[1]");
  EXPECT_EQ(from_modelopt_nvfp4(raw(DType::kU8, {n, k / 2}, weight), raw(DType::kU8, {n, k / 16}, scales), ws2).global_scales,
            m.global_scales);
  const RawTensor input = slice_expert(raw(DType::kF32, {2}, input_scales, "w13_input_scale"), 1);
  EXPECT_TRUE(input.shape.empty());
  EXPECT_EQ(nvfp4_input_dequant_factor(input, Nvfp4ScaleConvention::kModelOpt), 0.125f);
  const std::vector<float> d = dequantize(m);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = weight[r * k / 2 + c / 2];
      const uint8_t code = (c & 1) ? byte >> 4 : byte & 15;
      const double expect = double(e2m1_to_f32(code)) * e4m3_to_f32(scales[r * 2 + c / 16]) * globals[r < n / 2 ? 0 : 1];
      ASSERT_EQ(d[r * k + c], static_cast<float>(expect)) << r << "," << c;
    }
}

TEST(FormatsCheckpoint, FuseW13WithDifferentNvfp4GlobalsIsExact) {
  // compressed-tensors stores gate_proj and up_proj separately with their own weight_global_scale.
  const int64_t i = 4, h = 32;
  const std::vector<uint8_t> gate_w = random_bytes(i * h / 2, 11), up_w = random_bytes(i * h / 2, 12);
  const std::vector<uint8_t> gate_s = random_bytes(i * h / 16, 13, 0x7F), up_s = random_bytes(i * h / 16, 14, 0x7F);
  const std::vector<float> gate_g{2.0f}, up_g{4.0f};
  const QuantizedMatrix gate = from_compressed_tensors_nvfp4(raw(DType::kU8, {i, h / 2}, gate_w),
                                                             raw(DType::kFP8E4M3, {i, h / 16}, gate_s),
                                                             raw(DType::kF32, {1}, gate_g));
  const QuantizedMatrix up = from_compressed_tensors_nvfp4(raw(DType::kU8, {i, h / 2}, up_w),
                                                           raw(DType::kFP8E4M3, {i, h / 16}, up_s), raw(DType::kF32, {1}, up_g));
  const QuantizedMatrix w13 = fuse_w13(gate, up);
  EXPECT_EQ(w13.rows, 2 * i);
  EXPECT_EQ(w13.global_scales, (std::array<float, 2>{0.5f, 0.25f}));
  std::vector<float> expect = dequantize(gate);
  const std::vector<float> up_d = dequantize(up);
  expect.insert(expect.end(), up_d.begin(), up_d.end());
  EXPECT_EQ(dequantize(w13), expect);
  // An already fused input cannot be fused again.
  expect_error_mentions([&] { fuse_w13(w13, w13); }, {"gate global_scales {0.5, 0.25}", "one global"});
  QuantizedMatrix two_globals = gate;
  two_globals.global_scales = {0.5f, 0.25f};
  expect_error_mentions([&] { fuse_w13(two_globals, up); }, {"gate global_scales", "one global"});
}

TEST(FormatsCheckpoint, FuseW13ForEveryOtherFormat) {
  const uint32_t seed = 808;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(format)) + " seed " + std::to_string(seed));
    const int64_t i = 256, h = 160;  // fp8: I multiple of 128, H with a partial block
    std::vector<float> g(i * h), u(i * h);
    for (auto& x : g) x = dist(rng);
    for (auto& x : u) x = 100.0f * dist(rng);
    const QuantizedMatrix gate = quantize(g.data(), i, h, format), up = quantize(u.data(), i, h, format);
    const QuantizedMatrix w13 = fuse_w13(gate, up);
    std::vector<float> expect = dequantize(gate);
    const std::vector<float> up_d = dequantize(up);
    expect.insert(expect.end(), up_d.begin(), up_d.end());
    EXPECT_EQ(dequantize(w13), expect);
  }
  std::vector<float> w(100 * 128, 1.0f);
  const QuantizedMatrix small = quantize(w.data(), 100, 128, WeightFormat::kFp8Block);
  expect_error_mentions([&] { fuse_w13(small, small); }, {"I = 100", "multiple of 128"});
  const QuantizedMatrix other = quantize(w.data(), 100, 128, WeightFormat::kBf16);
  expect_error_mentions([&] { fuse_w13(small, other); }, {"fp8_block", "bf16"});
}

// ---- DeepSeek FP8 -----------------------------------------------------------------------------------------

TEST(FormatsCheckpoint, DeepSeekFp8BlockWorkedNumbers) {
  const int64_t n = 130, k = 200;  // weight_scale_inv [2, 2]
  std::vector<uint8_t> weight = random_bytes(n * k, 21, 0x7F);
  weight[0] = 0x38;                 // 1.0
  weight[129 * k + 150] = 0xC4;     // -3.0 (E4M3: s=1, e=8, m=4 -> -1.5 * 2)
  const std::vector<float> scale_inv{0.25f, 0.5f, 1.5f, 0.001f};
  const QuantizedMatrix m = from_deepseek_fp8(raw(DType::kFP8E4M3, {n, k}, weight, "w"),
                                              raw(DType::kF32, {2, 2}, scale_inv, "w_scale_inv"));
  const std::vector<float> d = dequantize(m);
  EXPECT_EQ(d[0], 0.25f);                 // 1.0 * scale_inv[0, 0]
  EXPECT_EQ(d[129 * k + 150], -0.003f);   // -3.0 * scale_inv[1, 1], rounded once to FP32
  EXPECT_EQ(d[129 * k + 150], static_cast<float>(-3.0 * double(0.001f)));
  const std::vector<float> bad_scale(2, 1.0f);
  expect_error_mentions([&] { from_deepseek_fp8(raw(DType::kFP8E4M3, {n, k}, weight), raw(DType::kF32, {1, 2}, bad_scale, "layers.0.w1.weight_scale_inv")); },
                        {"weight_scale_inv 'layers.0.w1.weight_scale_inv'", "[2, 2]", "[1, 2]"});
  expect_error_mentions([&] { from_deepseek_fp8(raw(DType::kFP8E5M2, {n, k}, weight, "w"), raw(DType::kF32, {2, 2}, scale_inv)); },
                        {"weight 'w'", "e5m2", "not exact"});
  expect_error_mentions([&] { from_deepseek_fp8(raw(DType::kBF16, {n, k / 2}, weight), raw(DType::kF32, {2, 1}, scale_inv)); },
                        {"weight", "fp8_e4m3 or u8"});
}

// ---- MXFP4 ------------------------------------------------------------------------------------------------

TEST(FormatsCheckpoint, Mxfp4GptOssLayoutAndCompressedTensorsLayoutAgree) {
  const int64_t experts = 3, n = 4, k = 64;
  std::vector<uint8_t> blocks = random_bytes(experts * n * (k / 32) * 16, 31);
  std::vector<uint8_t> scales = random_bytes(experts * n * (k / 32), 32);
  for (auto& s : scales) s = static_cast<uint8_t>(110 + s % 30);
  // Expert 1, row 0, first byte 0x7B: k0 = code 0xB = -1.5, k1 = code 0x7 = 6; scale 128 = 2^1.
  blocks[1 * n * (k / 32) * 16] = 0x7B;
  scales[1 * n * (k / 32)] = 128;
  const RawTensor stacked_blocks = raw(DType::kU8, {experts, n, k / 32, 16}, blocks, "experts.gate_up_proj_blocks");
  const RawTensor stacked_scales = raw(DType::kU8, {experts, n, k / 32}, scales, "experts.gate_up_proj_scales");
  const QuantizedMatrix gptoss = from_mxfp4(slice_expert(stacked_blocks, 1), slice_expert(stacked_scales, 1));
  EXPECT_EQ(gptoss.rows, n);
  EXPECT_EQ(gptoss.cols, k);
  const std::vector<float> d = dequantize(gptoss);
  EXPECT_EQ(d[0], -3.0f);
  EXPECT_EQ(d[1], 12.0f);
  // compressed-tensors / INC: weight_packed [N, K/2] + weight_scale [N, K/32] holding the same bytes.
  RawTensor packed = slice_expert(stacked_blocks, 1);
  packed.shape = {n, k / 2};
  RawTensor scale = slice_expert(stacked_scales, 1);
  scale.dtype = DType::kUE8M0;
  const QuantizedMatrix ct = from_mxfp4(packed, scale);
  EXPECT_EQ(ct.data, gptoss.data);
  EXPECT_EQ(ct.group_scales, gptoss.group_scales);
  EXPECT_EQ(dequantize(ct), d);
  expect_error_mentions([&] { slice_expert(stacked_blocks, 3); }, {"experts.gate_up_proj_blocks", "expert 3", "E = 3"});
  RawTensor wrong = slice_expert(stacked_scales, 0);
  wrong.shape = {n, k / 16};
  expect_error_mentions([&] { from_mxfp4(packed, wrong); }, {"scales 'experts.gate_up_proj_scales[0]'", "[4, 2]", "[4, 4]"});
  RawTensor odd = packed;
  odd.shape = {n, 12};  // K = 24
  expect_error_mentions([&] { from_mxfp4(odd, scale); }, {"K = 2 * shape[1] = 24", "multiple of 32"});
}

TEST(FormatsCheckpoint, DeinterleaveGptOssGateUp) {
  const uint32_t seed = 55;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  const int64_t i = 6, h = 64;
  std::vector<float> w(2 * i * h);
  for (auto& x : w) x = dist(rng);
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kMxfp4, WeightFormat::kNvfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(format)) + " seed " + std::to_string(seed));
    const QuantizedMatrix interleaved = quantize(w.data(), 2 * i, h, format);
    const std::vector<float> di = dequantize(interleaved);
    const std::vector<float> dd = dequantize(deinterleave_gate_up(interleaved));
    for (int64_t r = 0; r < 2 * i; ++r) {
      const int64_t src = r < i ? 2 * r : 2 * (r - i) + 1;  // gate i <- row 2i, up i <- row 2i+1
      for (int64_t c = 0; c < h; ++c) ASSERT_EQ(dd[r * h + c], di[src * h + c]) << r << "," << c;
    }
  }
  const QuantizedMatrix fp8 = quantize(w.data(), 2 * i, h, WeightFormat::kFp8Block);
  expect_error_mentions([&] { deinterleave_gate_up(fp8); }, {"fp8_block"});
}

// ---- bad inputs name the tensor -----------------------------------------------------------------------------

TEST(FormatsCheckpoint, BadNvfp4InputsNameTheTensor) {
  const std::vector<uint8_t> weight(4 * 8, 0x11), scale(4 * 1, 0x38);
  const std::vector<float> g1{1.0f}, g3{1.0f, 2.0f, 3.0f}, g0{0.0f};
  const RawTensor w = raw(DType::kU8, {4, 8}, weight, "mlp.experts.0.up_proj.weight");
  const RawTensor s = raw(DType::kFP8E4M3, {4, 1}, scale, "mlp.experts.0.up_proj.weight_scale");
  EXPECT_NO_THROW(from_modelopt_nvfp4(w, s, raw(DType::kF32, {}, g1)));
  expect_error_mentions([&] { from_modelopt_nvfp4(w, raw(DType::kFP8E4M3, {4, 2}, scale, s.name), raw(DType::kF32, {}, g1)); },
                        {"weight_scale 'mlp.experts.0.up_proj.weight_scale'", "[4, 1]", "[4, 2]"});
  expect_error_mentions([&] { from_modelopt_nvfp4(w, s, raw(DType::kF32, {3}, g3, "ws2")); },
                        {"weight_scale_2 'ws2'", "[] or [1]", "[2]", "[3]"});
  expect_error_mentions([&] { from_compressed_tensors_nvfp4(w, s, raw(DType::kF32, {1}, g0, "wgs")); },
                        {"weight_global_scale 'wgs'[0]", "finite and > 0"});
  expect_error_mentions([&] { from_modelopt_nvfp4(w, s, raw(DType::kBF16, {1}, g1, "ws2")); }, {"weight_scale_2 'ws2'", "f32"});
  const RawTensor narrow = raw(DType::kU8, {4, 4}, weight, "w");
  expect_error_mentions([&] { from_modelopt_nvfp4(narrow, s, raw(DType::kF32, {}, g1)); }, {"weight 'w'", "K = 2 * shape[1] = 8", "16"});
  const RawTensor odd_rows = raw(DType::kU8, {3, 8}, weight, "w");
  const std::vector<float> g2{1.0f, 2.0f};
  expect_error_mentions([&] { from_modelopt_nvfp4(odd_rows, raw(DType::kU8, {3, 1}, scale), raw(DType::kF32, {2}, g2, "ws2")); },
                        {"ws2", "even row count", "N = 3"});
  expect_error_mentions([&] { from_compressed_tensors_nvfp4(raw(DType::kF32, {4, 8}, weight, "wp"), s, raw(DType::kF32, {1}, g1)); },
                        {"weight_packed 'wp'", "u8 or fp4_e2m1x2"});
}

// QuantizedMatrix dequantize / quantize and FP8 activation quantization.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "megamoe/error.h"
#include "megamoe/formats.h"
#include "cpu/formats_test_util.h"

using namespace megamoe;
using namespace megamoe::formats;
using megamoe::test::expect_error_mentions;

namespace {

// Independent value tables (written out, not computed by the library).
constexpr double kE2M1Values[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
double e2m1_value(int code) { return (code & 8) ? -kE2M1Values[code & 7] : kE2M1Values[code & 7]; }
double e4m3_value(int bits) {  // NaN for 0x7F/0xFF
  const int e = (bits >> 3) & 15, m = bits & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (bits & 0x80) ? -mag : mag;
}

void set_nibble(std::vector<uint8_t>& data, int64_t row_bytes, int64_t r, int64_t c, int code) {
  uint8_t& b = data[r * row_bytes + c / 2];
  b = (c & 1) ? static_cast<uint8_t>((b & 0x0F) | (code << 4)) : static_cast<uint8_t>((b & 0xF0) | code);
}

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double rel_l2(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(ref[i]) - got[i]) * (double(ref[i]) - got[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// Half the gap of the E2M1 grid around |v| (v = |w| / step), with saturation above 6.
double e2m1_error_bound(double v) {
  if (v >= 6.0) return v - 6.0;
  if (v >= 4.0) return 1.0;
  if (v >= 2.0) return 0.5;
  return 0.25;
}

}  // namespace

// ---- exhaustive scale x code products ----------------------------------------------------------------

TEST(FormatsMatrix, Nvfp4EveryCodeTimesEveryE4M3ScaleIsTheFp64Product) {
  // Row r uses E4M3 scale byte r; the 16 columns hold the 16 E2M1 codes.
  for (const float global : {1.0f, 0.375f, 3.0e-3f}) {
    QuantizedMatrix m;
    m.format = WeightFormat::kNvfp4;
    m.rows = 256;
    m.cols = 16;
    m.data.assign(256 * 8, 0);
    m.group_scales.resize(256);
    m.global_scales = {global, global};
    for (int r = 0; r < 256; ++r) {
      m.group_scales[r] = static_cast<uint8_t>(r);
      for (int c = 0; c < 16; ++c) set_nibble(m.data, 8, r, c, c);
    }
    const std::vector<float> out = dequantize(m);
    const std::vector<double> exact = dequantize_f64(m);
    for (int r = 0; r < 256; ++r) {
      for (int c = 0; c < 16; ++c) {
        const double expect = e2m1_value(c) * e4m3_value(r) * global;
        const float got = out[r * 16 + c];
        if (std::isnan(expect)) {
          EXPECT_TRUE(std::isnan(got)) << "scale byte " << r << " code " << c;
          EXPECT_TRUE(std::isnan(exact[r * 16 + c]));
        } else {
          EXPECT_EQ(exact[r * 16 + c], expect) << "fp64: no rounding at all";
          EXPECT_EQ(got, static_cast<float>(expect)) << "scale byte " << r << " code " << c;
          if (global == 1.0f) {
            EXPECT_EQ(static_cast<double>(got), expect) << "exact without a global";
          }
        }
      }
    }
  }
}

TEST(FormatsMatrix, Mxfp4EveryCodeTimesEveryUe8m0ScaleIsTheFp64Product) {
  QuantizedMatrix m;
  m.format = WeightFormat::kMxfp4;
  m.rows = 256;
  m.cols = 32;
  m.data.assign(256 * 16, 0);
  m.group_scales.resize(256);
  for (int r = 0; r < 256; ++r) {
    m.group_scales[r] = static_cast<uint8_t>(r);
    for (int c = 0; c < 32; ++c) set_nibble(m.data, 16, r, c, (c * 7 + r) % 16);
  }
  const std::vector<float> out = dequantize(m);
  for (int r = 0; r < 256; ++r) {
    for (int c = 0; c < 32; ++c) {
      const float got = out[r * 32 + c];
      if (r == 255) {
        EXPECT_TRUE(std::isnan(got)) << "scale byte 255 is NaN";
        continue;
      }
      const double expect = e2m1_value((c * 7 + r) % 16) * std::ldexp(1.0, r - 127);
      // Exact in FP32 except 4 * 2^127 and 6 * 2^127, which exceed FP32 and become inf (documented).
      EXPECT_EQ(got, static_cast<float>(expect)) << "scale byte " << r << " column " << c;
      if (std::fabs(expect) < 3.4e38) {
        EXPECT_EQ(static_cast<double>(got), expect);
      }
    }
  }
}

TEST(FormatsMatrix, Fp8BlockDequantizeUsesTheBlockOfEachElement) {
  // 130 x 260: 2 x 3 blocks, the last ones partial.
  const int64_t rows = 130, cols = 260;
  QuantizedMatrix m;
  m.format = WeightFormat::kFp8Block;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(rows * cols);
  m.block_scales = {0.5f, 2.0f, 3.0f, 1e-3f, 7.0f, 0.125f};
  std::mt19937 rng(7);
  for (auto& b : m.data) b = static_cast<uint8_t>(rng() % 256);
  const std::vector<float> out = dequantize(m);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double expect = e4m3_value(m.data[r * cols + c]) * m.block_scales[(r / 128) * 3 + c / 128];
      if (std::isnan(expect)) {
        EXPECT_TRUE(std::isnan(out[r * cols + c]));
      } else {
        ASSERT_EQ(out[r * cols + c], static_cast<float>(expect)) << r << "," << c;
      }
    }
  }
}

TEST(FormatsMatrix, Nvfp4GateAndUpGlobalsApplyPerHalf) {
  QuantizedMatrix m;
  m.format = WeightFormat::kNvfp4;
  m.rows = 4;
  m.cols = 16;
  m.data.assign(4 * 8, 0x22);                // every element code 2 (= 1.0)
  m.group_scales.assign(4, 0x38);            // E4M3 1.0
  m.global_scales = {0.5f, 0.25f};
  const std::vector<float> out = dequantize(m);
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(out[0 * 16 + c], 0.5f);
    EXPECT_EQ(out[1 * 16 + c], 0.5f);
    EXPECT_EQ(out[2 * 16 + c], 0.25f);
    EXPECT_EQ(out[3 * 16 + c], 0.25f);
  }
}

// ---- quantize: bit-exact on representable inputs ------------------------------------------------------

TEST(FormatsMatrix, Bf16QuantizeIsExactOnBf16Values) {
  std::vector<float> w = gaussian(37 * 41, 11);
  for (auto& x : w) x = round_to_bf16(x);
  const QuantizedMatrix q = quantize(w.data(), 37, 41, WeightFormat::kBf16);
  EXPECT_NO_THROW(q.validate());
  EXPECT_EQ(dequantize(q), w);
  EXPECT_EQ(q.data[0] | (q.data[1] << 8), f32_to_bf16(w[0]));  // little-endian
}

TEST(FormatsMatrix, Fp8BlockQuantizeIsExactOnRepresentableInputs) {
  const uint32_t seed = 1234;
  std::mt19937 rng(seed);
  const int64_t rows = 200, cols = 300;  // partial blocks in both dimensions
  const int64_t brows = 2, bcols = 3;
  std::vector<float> block_scale(brows * bcols);
  for (int i = 0; i < brows * bcols; ++i) block_scale[i] = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 15);
  std::vector<uint8_t> codes(rows * cols);
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint8_t code = static_cast<uint8_t>(rng() % 256);
      if ((code & 0x7F) == 0x7F) code = 0x10;  // no NaN
      if (r % 128 == 5 && c % 128 == 9) code = (r & 1) ? 0xFE : 0x7E;  // each block holds +-448
      if (code == 0x80) code = 0;  // -0 quantizes back to -0 but compare codes simply
      codes[r * cols + c] = code;
      w[r * cols + c] = e4m3_to_f32(code) * block_scale[(r / 128) * bcols + c / 128];
    }
  const QuantizedMatrix q = quantize(w.data(), rows, cols, WeightFormat::kFp8Block);
  EXPECT_EQ(q.block_scales, block_scale) << "seed " << seed;
  EXPECT_EQ(q.data, codes) << "seed " << seed;
  EXPECT_EQ(dequantize(q), w) << "seed " << seed;
}

TEST(FormatsMatrix, Nvfp4QuantizeIsExactOnRepresentableInputs) {
  const uint32_t seed = 99;
  std::mt19937 rng(seed);
  const int64_t rows = 6, cols = 64;
  const float global = std::ldexp(1.0f, -12);
  std::vector<float> w(rows * cols);
  std::vector<uint8_t> scales(rows * cols / 16);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / 16; ++g) {
      // Scale codes 0x08..0x7E (normal, positive); one group holds 448 so that global = amax/2688.
      uint8_t s = static_cast<uint8_t>(0x08 + rng() % (0x7E - 0x08 + 1));
      if (r == 3 && g == 1) s = 0x7E;
      scales[r * (cols / 16) + g] = s;
      for (int64_t c = g * 16; c < g * 16 + 16; ++c) {
        int code = static_cast<int>(rng() % 16);
        if (c == g * 16 + 3) code = (r & 1) ? 0xF : 0x7;  // each group holds +-6
        if (code == 8) code = 0;
        w[r * cols + c] = static_cast<float>(e2m1_value(code) * e4m3_value(s) * global);
      }
    }
  const QuantizedMatrix q = quantize(w.data(), rows, cols, WeightFormat::kNvfp4);
  EXPECT_EQ(q.global_scales[0], global);
  EXPECT_EQ(q.global_scales[1], global);
  EXPECT_EQ(q.group_scales, scales) << "seed " << seed;
  EXPECT_EQ(dequantize(q), w) << "seed " << seed;
}

TEST(FormatsMatrix, Mxfp4QuantizeIsExactOnRepresentableInputs) {
  const uint32_t seed = 4242;
  std::mt19937 rng(seed);
  const int64_t rows = 5, cols = 96;
  std::vector<float> w(rows * cols);
  std::vector<uint8_t> scales(rows * cols / 32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / 32; ++g) {
      const uint8_t s = static_cast<uint8_t>(100 + rng() % 50);
      scales[r * (cols / 32) + g] = s;
      for (int64_t c = g * 32; c < g * 32 + 32; ++c) {
        int code = static_cast<int>(rng() % 16);
        if (c == g * 32 + 17) code = (g & 1) ? 0xE : 0x6;  // each group's amax is 4 * 2^e
        if (code == 7 || code == 0xF) code = 5;             // keep amax in [4, 8) * 2^e
        if (code == 8) code = 0;
        w[r * cols + c] = static_cast<float>(e2m1_value(code) * std::ldexp(1.0, s - 127));
      }
    }
  const QuantizedMatrix q = quantize(w.data(), rows, cols, WeightFormat::kMxfp4);
  EXPECT_EQ(q.group_scales, scales) << "seed " << seed;
  EXPECT_EQ(dequantize(q), w) << "seed " << seed;
}

// ---- quantize: error bounds on random data --------------------------------------------------------------

TEST(FormatsMatrix, QuantizeErrorBoundsOnGaussianData) {
  const uint32_t seed = 31337;
  const int64_t rows = 256, cols = 512;
  std::vector<float> w = gaussian(rows * cols, seed, 0.02f);
  w[17] = 0.5f;  // an outlier
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(format)) + " seed " + std::to_string(seed));
    const QuantizedMatrix q = quantize(w.data(), rows, cols, format);
    EXPECT_NO_THROW(q.validate());
    const std::vector<float> d = dequantize(q);
    const double err = rel_l2(w, d);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const double x = w[r * cols + c], y = d[r * cols + c];
        double bound = 0;
        switch (format) {
          case WeightFormat::kBf16: bound = std::fabs(x) * std::ldexp(1.0, -8); break;
          case WeightFormat::kFp8Block: {
            const double scale = q.block_scales[(r / 128) * (cols / 128) + c / 128];
            bound = std::max(std::fabs(x) * std::ldexp(1.0, -4), scale * std::ldexp(1.0, -10));
            break;
          }
          case WeightFormat::kNvfp4: {
            const double step = e4m3_to_f32(q.group_scales[r * (cols / 16) + c / 16]) * double(q.global_scales[0]);
            bound = step * e2m1_error_bound(std::fabs(x) / step);
            break;
          }
          case WeightFormat::kMxfp4: {
            const double step = ue8m0_to_f32(q.group_scales[r * (cols / 32) + c / 32]);
            bound = step * e2m1_error_bound(std::fabs(x) / step);
            break;
          }
        }
        // Slack: quantize divides by an FP32 step, so ties can land a few FP32 ulps of |w| either way.
        ASSERT_LE(std::fabs(x - y), bound + std::fabs(x) * 1e-6) << "at " << r << "," << c << " w=" << x << " got " << y;
      }
    }
    // Measured: bf16 0.0017, fp8_block 0.026, nvfp4 0.095, mxfp4 0.114 (this seed).
    const double limit = format == WeightFormat::kBf16 ? 2e-3 : format == WeightFormat::kFp8Block ? 0.03
                       : format == WeightFormat::kNvfp4 ? 0.11 : 0.13;
    EXPECT_LT(err, limit);
    EXPECT_GT(err, 0.0) << "random data is not exactly representable";
  }
}

TEST(FormatsMatrix, Nvfp4PerHalfGlobalsAreExactForDifferentGateAndUpRanges) {
  const uint32_t seed = 5;
  const int64_t rows = 8, cols = 32;
  std::vector<float> w = gaussian(rows * cols, seed);
  for (int64_t i = rows * cols / 2; i < rows * cols; ++i) w[i] *= 1e-3f;  // "up" 1000x smaller
  const QuantizedMatrix per_half = quantize_nvfp4_per_half(w.data(), rows, cols);
  const QuantizedMatrix shared = quantize(w.data(), rows, cols, WeightFormat::kNvfp4);
  EXPECT_NE(per_half.global_scales[0], per_half.global_scales[1]);
  EXPECT_EQ(shared.global_scales[0], shared.global_scales[1]);
  EXPECT_LT(rel_l2(w, dequantize(per_half)), 0.2) << "seed " << seed;
  // Bounds hold per half with that half's global.
  const std::vector<float> d = dequantize(per_half);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double step = e4m3_to_f32(per_half.group_scales[r * 2 + c / 16]) * double(per_half.global_scales[r < 4 ? 0 : 1]);
      const double x = w[r * cols + c];
      ASSERT_LE(std::fabs(x - d[r * cols + c]), step * e2m1_error_bound(std::fabs(x) / step) + std::fabs(x) * 1e-6);
    }
}

TEST(FormatsMatrix, Nvfp4ZeroGroupGivesZeroCodesAndAllZeroGivesUnitGlobal) {
  std::vector<float> w(2 * 32, 0.0f);
  for (int c = 16; c < 32; ++c) w[c] = 0.25f * (c - 20);  // row 0 group 1 non-zero
  const QuantizedMatrix q = quantize(w.data(), 2, 32, WeightFormat::kNvfp4);
  EXPECT_EQ(q.group_scales[0], 0);
  EXPECT_EQ(q.group_scales[2], 0);
  const std::vector<float> d = dequantize(q);
  for (int c = 0; c < 16; ++c) EXPECT_EQ(d[c], 0.0f);
  const std::vector<float> zeros(32, 0.0f);
  const QuantizedMatrix z = quantize(zeros.data(), 1, 32, WeightFormat::kNvfp4);
  EXPECT_EQ(z.global_scales[0], 1.0f);
  for (float x : dequantize(z)) EXPECT_EQ(x, 0.0f);
}

// ---- validation -------------------------------------------------------------------------------------------

TEST(FormatsMatrix, ValidateNamesTheFieldAndLimit) {
  std::vector<float> w = gaussian(4 * 32, 3);
  QuantizedMatrix q = quantize(w.data(), 4, 32, WeightFormat::kNvfp4);
  q.group_scales.pop_back();
  expect_error_mentions([&] { q.validate(); }, {"group_scales", "7", "8"});
  q = quantize(w.data(), 4, 32, WeightFormat::kNvfp4);
  q.global_scales[1] = 0.0f;
  expect_error_mentions([&] { q.validate(); }, {"global_scales[1]"});
  q = quantize(w.data(), 4, 32, WeightFormat::kFp8Block);
  q.block_scales.push_back(1.0f);
  expect_error_mentions([&] { q.validate(); }, {"block_scales", "ceil(rows/128)*ceil(cols/128)"});
  q = quantize(w.data(), 4, 32, WeightFormat::kMxfp4);
  q.data.resize(3);
  expect_error_mentions([&] { q.validate(); }, {"data", "64"});
  q = quantize(w.data(), 4, 32, WeightFormat::kBf16);
  q.global_scales = {2.0f, 2.0f};
  expect_error_mentions([&] { q.validate(); }, {"global_scales", "nvfp4 only"});
  expect_error_mentions([&] { quantize(w.data(), 4, 24, WeightFormat::kNvfp4); }, {"cols = 24", "16"});
  w[2 * 32 + 5] = INFINITY;
  expect_error_mentions([&] { quantize(w.data(), 4, 32, WeightFormat::kFp8Block); }, {"weight[2, 5] = inf", "not finite"});
  w[2 * 32 + 5] = NAN;
  expect_error_mentions([&] { quantize(w.data(), 4, 32, WeightFormat::kMxfp4); }, {"weight[2, 5]", "not finite"});
  w[2 * 32 + 5] = 0.0f;
  expect_error_mentions([&] { quantize(w.data(), 4, 48, WeightFormat::kMxfp4); }, {"cols = 48", "32"});
  QuantizedMatrix odd;
  odd.format = WeightFormat::kNvfp4;
  odd.rows = 1;
  odd.cols = 8;
  odd.data.resize(4);
  expect_error_mentions([&] { odd.validate(); }, {"cols = 8", "multiple of 16"});
  expect_error_mentions([&] { dequantize(odd); }, {"cols = 8"});
}

// ---- FP8 activations --------------------------------------------------------------------------------------

TEST(FormatsActivations, ExactOnRepresentableInputs) {
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  const int64_t rows = 3, cols = 300;  // groups of 128, 128, 44
  std::vector<float> x(rows * cols);
  std::vector<uint8_t> codes(rows * cols);
  std::vector<float> scales(rows * 3);
  for (int64_t r = 0; r < rows; ++r)
    for (int g = 0; g < 3; ++g) {
      scales[r * 3 + g] = std::ldexp(1.0f, static_cast<int>(rng() % 16) - 12);
      for (int64_t c = g * 128; c < std::min<int64_t>(cols, g * 128 + 128); ++c) {
        uint8_t code = static_cast<uint8_t>(rng() % 256);
        if ((code & 0x7F) == 0x7F || code == 0x80) code = 0x31;
        if (c == g * 128 + 40) code = 0xFE;  // -448
        codes[r * cols + c] = code;
        x[r * cols + c] = e4m3_to_f32(code) * scales[r * 3 + g];
      }
    }
  const Fp8Activations q = quantize_fp8_activations(x.data(), rows, cols);
  EXPECT_EQ(q.scales, scales) << "seed " << seed;
  EXPECT_EQ(q.values, codes) << "seed " << seed;
  EXPECT_EQ(dequantize_fp8_activations(q), x) << "seed " << seed;
}

TEST(FormatsActivations, FormulaAndErrorBoundOnRandomData) {
  const uint32_t seed = 2024;
  const int64_t rows = 17, cols = 700;
  std::vector<float> x = gaussian(rows * cols, seed, 3.0f);
  for (int64_t c = 128; c < 256; ++c) x[5 * cols + c] = 0.0f;  // an all-zero group: eps floor
  const Fp8Activations q = quantize_fp8_activations(x.data(), rows, cols);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(rows * 6));
  const std::vector<float> d = dequantize_fp8_activations(q);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < 6; ++g) {
      float amax = 0;
      for (int64_t c = g * 128; c < std::min<int64_t>(cols, g * 128 + 128); ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      const float scale = std::max(amax, 1e-10f) / 448.0f;
      ASSERT_EQ(q.scales[r * 6 + g], scale) << "seed " << seed << " row " << r << " group " << g;
      for (int64_t c = g * 128; c < std::min<int64_t>(cols, g * 128 + 128); ++c) {
        ASSERT_EQ(q.values[r * cols + c], f32_to_e4m3(x[r * cols + c] / scale));
        const double bound = std::max(std::fabs(double(x[r * cols + c])) / 16.0, double(scale) / 1024.0);
        ASSERT_LE(std::fabs(double(x[r * cols + c]) - d[r * cols + c]), bound * (1 + 1e-6));
      }
    }
  EXPECT_EQ(q.scales[5 * 6 + 1], 1e-10f / 448.0f);
  const std::vector<double> exact = dequantize_fp8_activations_f64(q);
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(exact[i], e4m3_value(q.values[i]) * double(q.scales[(i / cols) * 6 + (i % cols) / 128]));
    ASSERT_EQ(static_cast<float>(exact[i]), d[i]);
  }
  EXPECT_LT(rel_l2(x, d), 0.04);
  EXPECT_GT(rel_l2(x, d), 0.0);
}

TEST(FormatsActivations, NaNAndInfBehaviour) {
  std::vector<float> x(128, 1.0f);
  x[3] = NAN;
  x[4] = 2.0f;
  const Fp8Activations q = quantize_fp8_activations(x.data(), 1, 128);
  EXPECT_EQ(q.scales[0], 2.0f / 448.0f) << "NaN ignored by amax";
  EXPECT_EQ(q.values[3], 0x7F);
  EXPECT_EQ(q.values[4], 0x7E);
  x[3] = INFINITY;
  const Fp8Activations qi = quantize_fp8_activations(x.data(), 1, 128);
  EXPECT_EQ(qi.scales[0], INFINITY);
  EXPECT_EQ(qi.values[3] & 0x7F, 0x7F) << "inf / inf is NaN (its sign is the FPU's)";
  EXPECT_EQ(qi.values[0], 0x00);
  Fp8Activations bad = q;
  bad.scales.clear();
  expect_error_mentions([&] { dequantize_fp8_activations(bad); }, {"scales", "ceil(cols/128)"});
}

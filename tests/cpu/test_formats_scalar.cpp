// Exhaustive tests of the scalar conversions. The rounding reference is independent of the encoder:
// it enumerates every code, decodes it, sorts the finite values and checks the encoder at every
// value, every midpoint (tie -> even code) and the float neighbours of every midpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "megamoe/error.h"
#include "megamoe/formats.h"

using namespace megamoe::formats;

namespace {

struct Code {
  uint32_t bits;
  double value;
};

// Positive finite codes sorted by value (one entry per value: +0 only).
std::vector<Code> positive_finite_codes(int total_bits, const std::function<float(uint32_t)>& decode) {
  std::vector<Code> codes;
  const uint32_t sign = 1u << (total_bits - 1);
  for (uint32_t bits = 0; bits < sign; ++bits) {
    const float v = decode(bits);
    if (std::isfinite(v)) codes.push_back({bits, v});
  }
  std::sort(codes.begin(), codes.end(), [](const Code& a, const Code& b) { return a.value < b.value; });
  return codes;
}

// Checks `encode` against round-to-nearest-even on the grid of `decode`, both signs.
void check_rne_grid(int total_bits, const std::function<float(uint32_t)>& decode,
                    const std::function<uint32_t(float)>& encode, const char* name) {
  const std::vector<Code> codes = positive_finite_codes(total_bits, decode);
  const uint32_t sign = 1u << (total_bits - 1);
  ASSERT_GT(codes.size(), 4u);
  for (size_t i = 0; i < codes.size(); ++i) {
    for (const uint32_t s : {0u, sign}) {
      const float v = static_cast<float>(s ? -codes[i].value : codes[i].value);
      EXPECT_EQ(encode(v), codes[i].bits | s) << name << " value " << v;
      if (i + 1 == codes.size()) continue;
      const Code& lo = codes[i];
      const Code& hi = codes[i + 1];
      ASSERT_LT(lo.value, hi.value) << name << ": two codes with one value";
      const double midpoint = 0.5 * (lo.value + hi.value);
      const float mid = static_cast<float>(midpoint);
      ASSERT_EQ(static_cast<double>(mid), midpoint) << name << ": midpoint not an FP32";
      // Ties go to the code with an even significand, i.e. an even bit pattern (the last bit).
      const uint32_t even = (lo.bits & 1u) == 0 ? lo.bits : hi.bits;
      const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, INFINITY);
      EXPECT_EQ(encode(s ? -mid : mid), even | s) << name << " midpoint " << midpoint;
      EXPECT_EQ(encode(s ? -below : below), lo.bits | s) << name << " below midpoint " << midpoint;
      EXPECT_EQ(encode(s ? -above : above), hi.bits | s) << name << " above midpoint " << midpoint;
    }
  }
}

float f32_from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

}  // namespace

TEST(FormatsScalar, E4M3DecodeAnchorsAndAllCodesRoundTrip) {
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);  // exponent field 15 is finite in E4M3 "fn"
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  int nan_count = 0;
  for (int bits = 0; bits < 256; ++bits) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(bits));
    // Independent formula: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 m/8.
    const int e = (bits >> 3) & 15, m = bits & 7;
    const double expect = (e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7)) * ((bits & 0x80) ? -1 : 1);
    if (std::isnan(v)) {
      ++nan_count;
      EXPECT_EQ(f32_to_e4m3(v), bits) << "NaN keeps its sign";
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), expect) << bits;
    for (Overflow mode : {Overflow::kSaturate, Overflow::kNaN}) {
      const uint8_t back = f32_to_e4m3(v, mode);
      EXPECT_EQ(back, bits == 0x80 ? 0x80 : bits) << "code " << bits;  // -0 stays -0
    }
  }
  EXPECT_EQ(nan_count, 2);
}

TEST(FormatsScalar, E5M2DecodeAnchorsAndAllCodesRoundTrip) {
  EXPECT_EQ(e5m2_to_f32(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_f32(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_f32(0xFC), -INFINITY);
  int nan_count = 0;
  for (int bits = 0; bits < 256; ++bits) {
    const float v = e5m2_to_f32(static_cast<uint8_t>(bits));
    const int e = (bits >> 2) & 31, m = bits & 3;
    if (e == 31) {
      if (m == 0) {
        EXPECT_TRUE(std::isinf(v));
        EXPECT_EQ(f32_to_e5m2(v, Overflow::kNaN), bits);
        EXPECT_EQ(f32_to_e5m2(v, Overflow::kSaturate), (bits & 0x80) | 0x7B);
      } else {
        ++nan_count;
        EXPECT_TRUE(std::isnan(v));
        EXPECT_EQ(f32_to_e5m2(v), (bits & 0x80) | 0x7F) << "canonical NaN keeps the sign";
      }
      continue;
    }
    const double expect = (e == 0 ? std::ldexp(m / 4.0, -14) : std::ldexp(1.0 + m / 4.0, e - 15)) * ((bits & 0x80) ? -1 : 1);
    EXPECT_EQ(static_cast<double>(v), expect) << bits;
    EXPECT_EQ(f32_to_e5m2(v, Overflow::kSaturate), bits);
    EXPECT_EQ(f32_to_e5m2(v, Overflow::kNaN), bits);
  }
  EXPECT_EQ(nan_count, 6);
}

TEST(FormatsScalar, E4M3RoundsToNearestEvenOnEveryMidpoint) {
  check_rne_grid(8, [](uint32_t b) { return e4m3_to_f32(static_cast<uint8_t>(b)); },
                 [](float v) { return static_cast<uint32_t>(f32_to_e4m3(v)); }, "e4m3");
}

TEST(FormatsScalar, E5M2RoundsToNearestEvenOnEveryMidpoint) {
  check_rne_grid(8, [](uint32_t b) { return e5m2_to_f32(static_cast<uint8_t>(b)); },
                 [](float v) { return static_cast<uint32_t>(f32_to_e5m2(v)); }, "e5m2");
}

TEST(FormatsScalar, E2M1RoundsToNearestEvenOnEveryMidpoint) {
  const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(code)), (code & 8) ? -expected[code & 7] : expected[code & 7]);
  }
  check_rne_grid(4, [](uint32_t b) { return e2m1_to_f32(static_cast<uint8_t>(b)); },
                 [](float v) { return static_cast<uint32_t>(f32_to_e2m1(v)); }, "e2m1");
  // Hand-derived ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(-5.0f), 0xE);
  // Saturation and the documented NaN rule.
  EXPECT_EQ(f32_to_e2m1(6.5f), 7);
  EXPECT_EQ(f32_to_e2m1(1e30f), 7);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xF);
  EXPECT_EQ(f32_to_e2m1(NAN), 7);
  EXPECT_THROW(e2m1_to_f32(16), megamoe::Error);
}

TEST(FormatsScalar, Fp8OverflowModes) {
  // E4M3: 464 is the tie between 448 (mantissa 110, even) and the unrepresentable 480.
  EXPECT_EQ(f32_to_e4m3(464.0f, Overflow::kNaN), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(464.0f, 0.0f), Overflow::kNaN), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(464.0f, 1e9f), Overflow::kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-std::nextafter(464.0f, 1e9f), Overflow::kNaN), 0xFF);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(464.0f, 1e9f), Overflow::kSaturate), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-1e30f, Overflow::kSaturate), 0xFE);
  EXPECT_EQ(f32_to_e4m3(INFINITY, Overflow::kSaturate), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-INFINITY, Overflow::kNaN), 0xFF);
  EXPECT_EQ(f32_to_e4m3(NAN, Overflow::kSaturate), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-NAN, Overflow::kSaturate), 0xFF);
  // Underflow: half of the smallest subnormal 2^-9 ties to 0; just above rounds up.
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.0f, -11)), 0x80);
  // E5M2: 61440 is the tie between 57344 (mantissa 11, odd) and 65536 (inf): ties to even -> inf.
  EXPECT_EQ(f32_to_e5m2(std::nextafter(61440.0f, 0.0f), Overflow::kNaN), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61440.0f, Overflow::kNaN), 0x7C);
  EXPECT_EQ(f32_to_e5m2(-61440.0f, Overflow::kNaN), 0xFC);
  EXPECT_EQ(f32_to_e5m2(61440.0f, Overflow::kSaturate), 0x7B);
  EXPECT_EQ(f32_to_e5m2(-INFINITY, Overflow::kSaturate), 0xFB);
  EXPECT_EQ(f32_to_e5m2(NAN), 0x7F);
}

TEST(FormatsScalar, Bf16AllPatternsRoundTripAndRne) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float v = bf16_to_f32(static_cast<uint16_t>(bits));
    EXPECT_EQ(std::bit_cast<uint32_t>(v), bits << 16);
    const uint16_t back = f32_to_bf16(v);
    if (std::isnan(v)) {
      EXPECT_EQ(back, (bits & 0x8000u) | 0x7FC0u);
    } else {
      ASSERT_EQ(back, bits) << "bf16 pattern " << bits;
    }
  }
  check_rne_grid(16, [](uint32_t b) { return bf16_to_f32(static_cast<uint16_t>(b)); },
                 [](float v) { return static_cast<uint32_t>(f32_to_bf16(v)); }, "bf16");
  // Overflow to inf (IEEE): the largest finite bf16 is 0x7F7F; the tie above it goes to inf.
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  // FP32 subnormals round on the same grid.
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00008000u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
}

TEST(FormatsScalar, Fp16AllPatternsRoundTripAndRne) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float v = f16_to_f32(static_cast<uint16_t>(bits));
    const uint16_t back = f32_to_f16(v);
    if (std::isnan(v)) {
      EXPECT_EQ(back, (bits & 0x8000u) | 0x7E00u);
    } else {
      ASSERT_EQ(back, bits) << "fp16 pattern " << bits;
    }
  }
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  check_rne_grid(16, [](uint32_t b) { return f16_to_f32(static_cast<uint16_t>(b)); },
                 [](float v) { return static_cast<uint32_t>(f32_to_f16(v)); }, "fp16");
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie between 65504 and 65536 -> even -> inf
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
}

#if defined(__FLT16_MAX__)
// A second, fully independent implementation: the compiler's _Float16 conversion (RNE, IEEE).
TEST(FormatsScalar, Fp16MatchesCompilerFloat16OnRandomFloats) {
  const uint32_t seed = 20261129;
  std::mt19937 rng(seed);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = rng();
    // Bias towards the FP16 range: keep the exponent within [2^-30, 2^20] most of the time.
    const uint32_t exponent = (i & 1) ? (97 + (rng() % 52)) : ((bits >> 23) & 0xFF);
    const float v = f32_from_bits((bits & 0x807FFFFFu) | (exponent << 23));
    const _Float16 h = static_cast<_Float16>(v);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    if (std::isnan(v)) continue;
    ASSERT_EQ(f32_to_f16(v), hb) << "seed " << seed << " value bits " << std::hex << std::bit_cast<uint32_t>(v);
    ASSERT_EQ(std::bit_cast<uint32_t>(f16_to_f32(hb)), std::bit_cast<uint32_t>(static_cast<float>(h)));
  }
}
#endif

TEST(FormatsScalar, Ue8m0) {
  EXPECT_EQ(ue8m0_to_f32(127), 1.0f);
  EXPECT_EQ(ue8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(ue8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(255)));
  for (int bits = 0; bits < 255; ++bits) {
    const float v = ue8m0_to_f32(static_cast<uint8_t>(bits));
    EXPECT_EQ(static_cast<double>(v), std::ldexp(1.0, bits - 127));
    EXPECT_EQ(f32_to_ue8m0_ceil(v), bits) << "powers of two map to themselves";
    if (bits > 0 && bits < 254) {
      EXPECT_EQ(f32_to_ue8m0_ceil(std::nextafter(v, INFINITY)), bits + 1);
      EXPECT_EQ(f32_to_ue8m0_ceil(std::nextafter(v, 0.0f)), bits);
    }
  }
  EXPECT_EQ(f32_to_ue8m0_ceil(3.0f), 129);
  EXPECT_EQ(f32_to_ue8m0_ceil(0.0f), 0);
  EXPECT_EQ(f32_to_ue8m0_ceil(std::ldexp(1.0f, -140)), 0);
  EXPECT_EQ(f32_to_ue8m0_ceil(std::nextafter(std::ldexp(1.0f, 127), INFINITY)), 255);
  EXPECT_EQ(f32_to_ue8m0_ceil(INFINITY), 255);
  EXPECT_EQ(f32_to_ue8m0_ceil(NAN), 255);
}

// quotient_by_reciprocal (src/kernels/exact_quotient.h), the division of the GEMM-1 rows epilogue's FP8 requantization:
// against IEEE fp32 division on the host, in the epilogue's range (scale = RN(max(RN(amax |w|), 1e-10) / 448), x =
// RN(h w) with |h| <= amax): the same float wherever the NOTES there claim it (|x| >= 2^-103 and |x / scale| >=
// 2^-126, or x = +-0) and, everywhere, the same E4M3 code (formats::f32_to_e4m3, saturating, the cvt of the kernel).
// Fresh random draws each run; amax from subnormal to 1e30, h of every kind (+-amax, +-0, subnormal, fractions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "kernels/exact_quotient.h"
#include "megamoe/formats.h"

namespace megamoe::kernels {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(ExactQuotient, MatchesIeeeDivisionInTheQuantizationRange) {
  std::random_device device;
  const uint64_t seed = (static_cast<uint64_t>(device()) << 32) | device();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int kDraws = 16'000'000;
  int64_t same_float = 0, float_claimed = 0, code_mismatches = 0, float_mismatches = 0;
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t r = rng(), r2 = rng();
    // amax: any positive finite float below ~1e30 (bit patterns: subnormals included); w in [0.01, 1].
    const float amax = float_of(static_cast<uint32_t>(r % 0x72000000u) + 1u);
    const float w = 0.01f + static_cast<float>(r2 & 0xFFFFFF) / static_cast<float>(0x1000000);
    const float scale = std::fmax(amax * w, 1e-10f) / 448.0f;
    float h;
    switch ((r2 >> 24) & 7) {
      case 0: h = amax; break;
      case 1: h = -amax; break;
      case 2: h = ((r2 >> 27) & 1) ? -0.0f : 0.0f; break;
      case 3: h = float_of(static_cast<uint32_t>((r2 >> 28) & 0x807FFFFFu)); break;  // +-subnormal
      default:
        h = amax * (static_cast<float>((r2 >> 28) & 0xFFFFFF) / static_cast<float>(0x1000000));
        if ((r2 >> 60) & 1) h = -h;
    }
    const float x = h * w;
    const float reciprocal = 1.0f / scale;  // RN(1 / scale): the device's __frcp_rn
    const float got = quotient_by_reciprocal(x, scale, reciprocal);
    const float want = x / scale;
    const bool claimed = x == 0.0f || (std::fabs(x) >= 0x1p-103f && std::fabs(want) >= 0x1p-126f);
    float_claimed += claimed;
    if (bits_of(got) == bits_of(want)) {
      ++same_float;
    } else if (claimed && float_mismatches++ < 5) {
      ADD_FAILURE() << std::hexfloat << "x " << x << " / " << scale << ": " << got << ", IEEE " << want;
    }
    if (formats::f32_to_e4m3(got) != formats::f32_to_e4m3(want) && code_mismatches++ < 5)
      ADD_FAILURE() << std::hexfloat << "E4M3 code of x " << x << " / " << scale << ": " << got << " vs " << want;
  }
  EXPECT_EQ(float_mismatches, 0);
  EXPECT_EQ(code_mismatches, 0);
  // The draws must exercise the claimed range (most of them) and the unclaimed one.
  EXPECT_GT(float_claimed, kDraws / 2);
  EXPECT_LT(float_claimed, kDraws);
  std::printf("quotient_by_reciprocal: %lld / %d floats equal to IEEE division (%lld in the claimed range)\n",
              static_cast<long long>(same_float), kDraws, static_cast<long long>(float_claimed));
}

// The divisors at the ends of the range and the significands next to powers of two (reciprocals near a binade edge),
// with numerators on a grid of significands and exponents.
TEST(ExactQuotient, MatchesIeeeDivisionAtBinadeEdges) {
  int64_t mismatches = 0, tested = 0;
  for (int scale_exponent : {-43, -20, -1, 0, 1, 30, 100}) {
    for (uint32_t scale_significand : {0u, 1u, 2u, 0x400000u, 0x7FFFFEu, 0x7FFFFFu, 0x2AAAABu, 0x555555u}) {
      const float scale = float_of(static_cast<uint32_t>(scale_exponent + 127) << 23 | scale_significand);
      const float reciprocal = 1.0f / scale;
      for (int ratio_exponent = -9; ratio_exponent <= 9; ++ratio_exponent)
        for (uint32_t x_significand = 0; x_significand < 0x800000u; x_significand += 0x1F3u) {
          const float ratio = float_of(static_cast<uint32_t>(ratio_exponent + 127) << 23 | x_significand);
          for (const float x : {ratio * scale, -ratio * scale, std::nextafter(ratio * scale, 0.0f)}) {
            ++tested;
            const float got = quotient_by_reciprocal(x, scale, reciprocal), want = x / scale;
            if (bits_of(got) != bits_of(want) && mismatches++ < 5)
              ADD_FAILURE() << std::hexfloat << "x " << x << " / " << scale << ": " << got << ", IEEE " << want;
          }
        }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << tested;
}

}  // namespace
}  // namespace megamoe::kernels

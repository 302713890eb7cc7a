// The W4A8 FP4 -> E4M3 decoder's bit logic (src/kernels/sm90_fp4_decode.cuh, host-compiled: the same
// functions the kernels inline) for every scale byte the packing can produce and every E2M1 code:
// v7 == old == e4m3_rn(e2m1 * scale * 2^p) (tests/common/fp8_codec.h, an independent table search),
// byte for byte; then whole rows (both shared-memory swizzles, every row 0..127, whole and half rows)
// of the v7 and v8 row decoders against the old one, and (v8) every scale byte at every decode exponent
// with every code in every group, through the row decoders themselves.
#pragma GCC diagnostic ignored "-Wunknown-pragmas"  // the header's #pragma unroll (device loops)

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/fp8_codec.h"
#include "kernels/sm90_fp4_decode.cuh"
#include "megamoe/formats.h"

namespace megamoe {
namespace {

using kernels::sm90::Fp4Format;
using kernels::sm90::Fp8Lut;

// |e2m1| magnitudes of codes 0..7 (independent of formats::e2m1_to_f32, which is cross-checked below).
constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// 16 words covering every code at every one of the 8 positions (codes[i] = (j + 3i) & 15 for word j),
// packed as grouped_gemm.h "W4A8" describes.
struct TestWord {
  uint32_t word;
  uint8_t codes[8];
};
std::vector<TestWord> all_code_words() {
  std::vector<TestWord> words;
  for (int j = 0; j < 16; ++j) {
    TestWord t{};
    for (int i = 0; i < 8; ++i) t.codes[i] = static_cast<uint8_t>((j + 3 * i) & 15);
    for (int i = 0; i < 4; ++i) {
      t.word |= static_cast<uint32_t>(t.codes[i] & 7) << (4 * i);
      t.word |= static_cast<uint32_t>(t.codes[i] >> 3) << (8 * i + 7);
      t.word |= static_cast<uint32_t>(t.codes[4 + i] & 7) << (16 + 4 * i);
      t.word |= static_cast<uint32_t>(t.codes[4 + i] >> 3) << (8 * i + 3);
    }
    words.push_back(t);
  }
  return words;
}

uint8_t output_byte(const uint2& out, int i) { return static_cast<uint8_t>((i < 4 ? out.x : out.y) >> (8 * (i & 3))); }

// Checks one table (old and v7 word decoders) against the reference for scale value `scale` (times 2^p).
void expect_tables(const Fp8Lut& old_lut, const Fp8Lut& v7_lut, double scaled, const std::string& what) {
  static const std::vector<TestWord> words = all_code_words();
  for (const TestWord& t : words) {
    const uint2 old_out = kernels::sm90::decode_fp4_word(t.word, old_lut);
    const uint2 v7_out = kernels::sm90::decode_fp4_word_v7(t.word, v7_lut);
    const uint2 v7_old_lut = kernels::sm90::decode_fp4_word_v7(t.word, old_lut);
    for (int i = 0; i < 8; ++i) {
      const double value = (t.codes[i] & 8 ? -1.0 : 1.0) * kE2m1[t.codes[i] & 7] * scaled;
      const uint8_t expected = testing::e4m3_encode(value);
      ASSERT_EQ(output_byte(old_out, i), expected) << what << " code " << int(t.codes[i]) << " (old)";
      ASSERT_EQ(output_byte(v7_out, i), expected) << what << " code " << int(t.codes[i]) << " (v7)";
      ASSERT_EQ(output_byte(v7_old_lut, i), expected) << what << " code " << int(t.codes[i]) << " (v7 word)";
    }
  }
}

TEST(Fp4Decode, E2m1TableMatchesFormats) {
  for (int c = 0; c < 8; ++c) EXPECT_EQ(formats::e2m1_to_f32(static_cast<uint8_t>(c)), kE2m1[c]);
}

TEST(Fp4Decode, BytePermEmulation) {  // the host prmt against hand-worked cases (device: __byte_perm)
  EXPECT_EQ(kernels::sm90::fp4_byte_perm(0x33221100u, 0x77665544u, 0x3210u), 0x33221100u);
  EXPECT_EQ(kernels::sm90::fp4_byte_perm(0x33221100u, 0x77665544u, 0x7654u), 0x77665544u);
  EXPECT_EQ(kernels::sm90::fp4_byte_perm(0x33221100u, 0x77665544u, 0x4140u), 0x44114400u);
  EXPECT_EQ(kernels::sm90::fp4_byte_perm(0x80u, 0x7Fu, 0x4808u), 0x7FFF80FFu);  // nibble bit 3: sign replicated
}

// NVFP4: every E4M3 scale byte (both signs, subnormals, 0; not the NaNs 0x7F / 0xFF) at every decode
// exponent where the packing can produce it (p in [-3, 15], 6 |s| 2^p <= 448), in scale words of 4
// groups (the byte in each position, the other three random valid bytes of the same p).
TEST(Fp4Decode, Nvfp4EveryScaleByteEveryCode) {
  std::mt19937 rng(7);
  int fast = 0, fallback = 0;
  for (int p = -3; p <= 15; ++p) {
    std::vector<uint8_t> valid;
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7F) == 0x7F) continue;
      if (6.0 * std::fabs(testing::e4m3_decode(static_cast<uint8_t>(b))) * std::ldexp(1.0, p) <= 448.0)
        valid.push_back(static_cast<uint8_t>(b));
    }
    const auto constants = kernels::sm90::nvfp4_v7_constants(p);
    for (uint8_t b : valid) {
      for (int position = 0; position < 4; ++position) {
        uint8_t bytes[4];
        for (int g = 0; g < 4; ++g) bytes[g] = g == position ? b : valid[rng() % valid.size()];
        if (position > 0) bytes[0] = b;  // also: all four groups the same byte (position 0 with copies)
        const uint32_t scales = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
        Fp8Lut old_luts[4], v7_luts[4];
        kernels::sm90::nvfp4_luts_f16(scales & 0xFFFFu, p, old_luts[0], old_luts[1]);
        kernels::sm90::nvfp4_luts_f16(scales >> 16, p, old_luts[2], old_luts[3]);
        const bool exact = kernels::sm90::nvfp4_luts_v7(scales, constants, v7_luts);
        (exact ? fast : fallback)++;
        if (!exact) {  // the row decoder's fallback
          kernels::sm90::nvfp4_luts_f16(scales & 0xFFFFu, p, v7_luts[0], v7_luts[1]);
          kernels::sm90::nvfp4_luts_f16(scales >> 16, p, v7_luts[2], v7_luts[3]);
        }
        for (int g = 0; g < 4; ++g) {
          const double scaled = testing::e4m3_decode(bytes[g]) * std::ldexp(1.0, p);
          expect_tables(old_luts[g], v7_luts[g], scaled,
                        "nvfp4 p " + std::to_string(p) + " byte " + std::to_string(bytes[g]) + " fast " +
                            std::to_string(exact));
          if (HasFatalFailure()) return;
        }
      }
    }
    // The fast range as documented: a word of one byte repeated is fast iff 8 <= b, 16 <= b + 8p, b < 128 (and
    // every producible positive byte has b + 8p <= 105, which the fast path assumes).
    for (uint8_t b : valid) {
      Fp8Lut luts[4];
      const bool exact = kernels::sm90::nvfp4_luts_v7(b * 0x01010101u, constants, luts);
      const int c1 = b + 8 * p;
      EXPECT_EQ(exact, b >= 8 && b < 128 && c1 >= 16) << "p " << p << " byte " << int(b);
      if (exact) {
        EXPECT_LE(c1, 105) << "p " << p << " byte " << int(b);  // what the fast path assumes
      }
      if (!exact) continue;
      Fp8Lut old_luts[2];
      kernels::sm90::nvfp4_luts_f16(b * 0x0101u, p, old_luts[0], old_luts[1]);
      for (int g = 0; g < 4; ++g)
        expect_tables(old_luts[g & 1], luts[g], testing::e4m3_decode(b) * std::ldexp(1.0, p),
                      "nvfp4 repeated p " + std::to_string(p) + " byte " + std::to_string(b));
      if (HasFatalFailure()) return;
      ++fast;
    }
  }
  EXPECT_GT(fast, 0);  // both paths ran (mixed words with a negative / tiny companion fall back)
  EXPECT_GT(fallback, 0);
}

// MXFP4: every E8M0 byte but NaN (255) at every producible decode exponent (b - 127 + p <= 6, p >= -121).
TEST(Fp4Decode, Mxfp4EveryScaleByteEveryCode) {
  for (int b = 0; b < 255; ++b) {
    for (int p = -121; b - 127 + p <= 6; ++p) {
      const auto constants = kernels::sm90::mxfp4_v7_constants(p);
      const Fp8Lut old_lut = kernels::sm90::mxfp4_lut_old(static_cast<uint32_t>(b), p);
      Fp8Lut v7_lut;
      if (!kernels::sm90::mxfp4_lut_v7(static_cast<uint32_t>(b), constants, v7_lut))
        v7_lut = kernels::sm90::mxfp4_lut_old(static_cast<uint32_t>(b), p);
      expect_tables(old_lut, v7_lut, std::ldexp(1.0, b - 127 + p),
                    "mxfp4 p " + std::to_string(p) + " byte " + std::to_string(b));
      if (HasFatalFailure()) return;
    }
  }
}

// Whole row slices: random FP4 tiles and scales of 128 rows, decoded by the old and the v7 row decoders
// (whole rows, and half rows as the small-M kernel's thread pairs split them), must give the same tile.
template <Fp4Format kFormat>
void expect_rows_equal(uint64_t seed) {
  constexpr int kScaleBytes = kernels::sm90::Fp4Traits<kFormat>::kScaleBytesPerRow;
  std::mt19937_64 rng(seed);
  alignas(16) static uint8_t fp4[128 * 64], scales[128 * kScaleBytes], old_tile[128 * 128], v7_tile[128 * 128],
      v8_tile[128 * 128];
  for (int trial = 0; trial < 40; ++trial) {
    const int p = kFormat == Fp4Format::kNvfp4 ? static_cast<int>(rng() % 19) - 3 : static_cast<int>(rng() % 20) - 2;
    for (auto& x : fp4) x = static_cast<uint8_t>(rng());
    // NVFP4 scale bytes the packing can produce at p; even trials: only positive normal ones with
    // b + 8p >= 16 (mostly the fast path) where there are such bytes.
    std::vector<uint8_t> producible, fast;
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7F) == 0x7F || 6.0 * std::fabs(testing::e4m3_decode(static_cast<uint8_t>(b))) * std::ldexp(1.0, p) > 448.0)
        continue;
      producible.push_back(static_cast<uint8_t>(b));
      if (b >= 8 && b < 0x80 && b + 8 * p >= 16) fast.push_back(static_cast<uint8_t>(b));
    }
    const std::vector<uint8_t>& pool = trial % 2 == 0 && !fast.empty() ? fast : producible;
    for (auto& s : scales) {
      if (kFormat == Fp4Format::kNvfp4) {
        s = pool[rng() % pool.size()];
      } else {
        s = static_cast<uint8_t>(127 - p + 6 - static_cast<int>(rng() % (trial % 2 == 0 ? 8 : 40)));
      }
    }
    for (int half = 0; half < 3; ++half) {  // 0: whole rows; 1, 2: thread pairs (slots 0-1 then 2-3, or reversed)
      for (auto& x : old_tile) x = 0xA5;
      for (auto& x : v7_tile) x = 0x5A;
      for (auto& x : v8_tile) x = 0x3C;
      for (int row = 0; row < 128; ++row) {
        if (half == 0) {
          kernels::sm90::decode_fp4_row<kFormat>(fp4, scales, old_tile, row, p);
          kernels::sm90::decode_fp4_row_chunks_v7<kFormat, 4>(fp4, scales, v7_tile, row, 0, p);
          kernels::sm90::decode_fp4_row_chunks_v8<kFormat, 4>(fp4, scales, v8_tile, row, 0, p);
        } else {
          for (int t = 0; t < 2; ++t) {
            const int first = 2 * (half == 1 ? t : 1 - t);
            kernels::sm90::decode_fp4_row_chunks<kFormat, 2>(fp4, scales, old_tile, row, first, p);
            kernels::sm90::decode_fp4_row_chunks_v7<kFormat, 2>(fp4, scales, v7_tile, row, first, p);
            kernels::sm90::decode_fp4_row_chunks_v8<kFormat, 2>(fp4, scales, v8_tile, row, first, p);
          }
        }
      }
      for (int i = 0; i < 128 * 128; ++i) {
        ASSERT_EQ(v7_tile[i], old_tile[i]) << "trial " << trial << " p " << p << " split " << half << " row "
                                           << i / 128 << " byte " << i % 128;
        ASSERT_EQ(v8_tile[i], old_tile[i]) << "v8 trial " << trial << " p " << p << " split " << half << " row "
                                           << i / 128 << " byte " << i % 128;
      }
    }
  }
}

TEST(Fp4Decode, Nvfp4RowsV7V8EqualOld) { expect_rows_equal<Fp4Format::kNvfp4>(11); }
TEST(Fp4Decode, Mxfp4RowsV7V8EqualOld) { expect_rows_equal<Fp4Format::kMxfp4>(12); }

// v8 == old through the row decoders (whole rows and both half-row splits) for EVERY scale byte the packing
// can produce at EVERY decode exponent, at every group position of a row, with every E2M1 code (both signs)
// in every group, and (NVFP4) the byte's scale word completed by the fast-path companions or by random
// producible ones (so the byte runs both the integer tables and the f16 fallback where it can).
// Tile layout: FP4 value i of group g of row r has code (i + r + 5 g) & 15 (16 consecutive values of a
// group: all 16 codes); the byte under test sits at group `position` of every row, the other groups get
// random companions per row.
template <Fp4Format kFormat>
void expect_every_scale_byte_v8(uint64_t seed) {
  constexpr int kScaleBytes = kernels::sm90::Fp4Traits<kFormat>::kScaleBytesPerRow;
  constexpr int kGroup = kernels::sm90::Fp4Traits<kFormat>::kGroup;
  std::mt19937_64 rng(seed);
  alignas(16) static uint8_t fp4[128 * 64], scales[128 * kScaleBytes], old_tile[128 * 128], v8_tile[128 * 128],
      v8_half[128 * 128];
  // The TMA 64-byte swizzle: logical 16-byte chunk c of row r at slot c ^ ((r >> 1) & 3); words packed as
  // grouped_gemm.h "W4A8" (bytes of a word: values 0-3 low nibbles / sign bit 7, values 4-7 bits 4-6 / bit 3).
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 4; ++c) {
      for (int w = 0; w < 4; ++w) {
        uint32_t word = 0;
        for (int i = 0; i < 8; ++i) {
          const int value = 32 * c + 8 * w + i;  // K index in the row
          const uint32_t code = static_cast<uint32_t>((value % kGroup + r + 5 * (value / kGroup)) & 15);
          if (i < 4) word |= (code & 7) << (4 * i) | (code >> 3) << (8 * i + 7);
          else word |= (code & 7) << (16 + 4 * (i - 4)) | (code >> 3) << (8 * (i - 4) + 3);
        }
        std::memcpy(fp4 + r * 64 + 16 * (c ^ ((r >> 1) & 3)) + 4 * w, &word, 4);
      }
    }
  }
  int tiles = 0;
  const int p_lo = kFormat == Fp4Format::kNvfp4 ? -3 : -121, p_hi = kFormat == Fp4Format::kNvfp4 ? 15 : 133;
  for (int p = p_lo; p <= p_hi; ++p) {
    std::vector<uint8_t> producible, fast;
    for (int b = 0; b < 256; ++b) {
      bool ok;
      if (kFormat == Fp4Format::kNvfp4)
        ok = (b & 0x7F) != 0x7F && 6.0 * std::fabs(testing::e4m3_decode(static_cast<uint8_t>(b))) * std::ldexp(1.0, p) <= 448.0;
      else
        ok = b < 255 && b - 127 + p <= 6;
      if (!ok) continue;
      producible.push_back(static_cast<uint8_t>(b));
      if (kFormat == Fp4Format::kNvfp4 ? (b >= 8 && b < 0x80 && b + 8 * p >= 16) : (b - 127 + p >= -5))
        fast.push_back(static_cast<uint8_t>(b));
    }
    if (producible.empty()) continue;
    // Each tile: 128 rows, row r tests byte producible[(base + r) % n] at group `position`.
    const int n = static_cast<int>(producible.size());
    for (int position = 0; position < kScaleBytes; ++position) {
      for (int companions = 0; companions < 2; ++companions) {
        const std::vector<uint8_t>& pool = companions == 0 && !fast.empty() ? fast : producible;
        for (int base = 0; base < n; base += 128) {
          for (int r = 0; r < 128; ++r)
            for (int g = 0; g < kScaleBytes; ++g)
              scales[r * kScaleBytes + g] = g == position ? producible[(base + r) % n] : pool[rng() % pool.size()];
          for (auto& x : old_tile) x = 0xA5;
          for (auto& x : v8_tile) x = 0x3C;
          for (auto& x : v8_half) x = 0xC3;
          for (int r = 0; r < 128; ++r) {
            kernels::sm90::decode_fp4_row<kFormat>(fp4, scales, old_tile, r, p);
            kernels::sm90::decode_fp4_row_chunks_v8<kFormat, 4>(fp4, scales, v8_tile, r, 0, p);
            kernels::sm90::decode_fp4_row_chunks_v8<kFormat, 2>(fp4, scales, v8_half, r, 2, p);
            kernels::sm90::decode_fp4_row_chunks_v8<kFormat, 2>(fp4, scales, v8_half, r, 0, p);
          }
          ++tiles;
          for (int i = 0; i < 128 * 128; ++i) {
            const int r = i / 128;
            ASSERT_EQ(v8_tile[i], old_tile[i]) << "p " << p << " row " << r << " byte " << i % 128 << " scales "
                                               << int(scales[r * kScaleBytes + position]) << " at " << position;
            ASSERT_EQ(v8_half[i], old_tile[i]) << "half rows p " << p << " row " << r << " byte " << i % 128;
          }
        }
      }
    }
    // The old decoder itself against the independent reference on one such tile (so "== old" means correct):
    // row r, output K index k (unswizzled from chunk (k / 16) ^ (r & 7)).
    for (int r = 0; r < 128; ++r) {
      for (int k = 0; k < 128; ++k) {
        const int code = (k % kGroup + r + 5 * (k / kGroup)) & 15;
        const uint8_t s = scales[r * kScaleBytes + k / kGroup];
        const double scale =
            kFormat == Fp4Format::kNvfp4 ? testing::e4m3_decode(s) * std::ldexp(1.0, p) : std::ldexp(1.0, s - 127 + p);
        const double value = (code & 8 ? -1.0 : 1.0) * kE2m1[code & 7] * scale;
        const uint8_t got = old_tile[r * 128 + 16 * ((k / 16) ^ (r & 7)) + k % 16];
        ASSERT_EQ(got, testing::e4m3_encode(value)) << "old p " << p << " row " << r << " k " << k;
      }
    }
  }
  EXPECT_GT(tiles, 0);
}

TEST(Fp4Decode, Nvfp4V8EveryScaleByteEveryCodeRows) { expect_every_scale_byte_v8<Fp4Format::kNvfp4>(21); }
TEST(Fp4Decode, Mxfp4V8EveryScaleByteEveryCodeRows) { expect_every_scale_byte_v8<Fp4Format::kMxfp4>(22); }

}  // namespace
}  // namespace megamoe

// Cross-check of the scalar conversions against an independent implementation (ml_dtypes / numpy),
// through a golden file made by scripts/fixtures/make_format_golden.py (no Python needed here).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "megamoe/formats.h"

using namespace megamoe::formats;

namespace {

struct Golden {
  std::vector<float> inputs;
  std::vector<uint16_t> bf16, f16;
  std::vector<uint8_t> e4m3, e5m2, e2m1;
};

template <typename T>
void read_array(const std::vector<char>& bytes, size_t& offset, size_t count, std::vector<T>& out) {
  ASSERT_LE(offset + count * sizeof(T), bytes.size()) << "golden file truncated";
  out.resize(count);
  std::memcpy(out.data(), bytes.data() + offset, count * sizeof(T));  // little-endian host
  offset += count * sizeof(T);
}

void load(Golden& g) {
  const std::string path = std::string(MEGAMOE_SOURCE_DIR) + "/tests/fixtures/formats/conversions.bin";
  std::ifstream file(path, std::ios::binary);
  ASSERT_TRUE(file) << "cannot open " << path;
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 8u);
  ASSERT_EQ(std::string(bytes.data(), 4), "MMFG");
  uint32_t count = 0;
  std::memcpy(&count, bytes.data() + 4, 4);
  ASSERT_GT(count, 10000u);
  size_t offset = 8;
  read_array(bytes, offset, count, g.inputs);
  read_array(bytes, offset, count, g.bf16);
  read_array(bytes, offset, count, g.f16);
  read_array(bytes, offset, count, g.e4m3);
  read_array(bytes, offset, count, g.e5m2);
  read_array(bytes, offset, count, g.e2m1);
  ASSERT_EQ(offset, bytes.size());
}

}  // namespace

TEST(FormatsGolden, MatchesMlDtypesOnGridsMidpointsAndRandomFloats) {
  Golden g;
  ASSERT_NO_FATAL_FAILURE(load(g));
  size_t checked = 0;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const float x = g.inputs[i];
    if (std::isnan(x)) {
      // NaN payloads are library conventions: only NaN-ness is compared.
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(x))));
      EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(x))));
      EXPECT_TRUE(std::isnan(e5m2_to_f32(f32_to_e5m2(x))));
      continue;
    }
    ++checked;
    EXPECT_EQ(f32_to_bf16(x), g.bf16[i]) << "bf16 of " << x;
    EXPECT_EQ(f32_to_f16(x), g.f16[i]) << "f16 of " << x;
    // ml_dtypes E4M3FN overflows to NaN (sign kept) and E5M2 to +-inf: our Overflow::kNaN mode.
    EXPECT_EQ(f32_to_e4m3(x, Overflow::kNaN), g.e4m3[i]) << "e4m3 of " << x;
    EXPECT_EQ(f32_to_e5m2(x, Overflow::kNaN), g.e5m2[i]) << "e5m2 of " << x;
    // E2M1 has no NaN/inf: both saturate.
    EXPECT_EQ(f32_to_e2m1(x), g.e2m1[i]) << "e2m1 of " << x;
    // Saturating FP8 is the non-saturating result with overflow (NaN / inf) replaced by +-max.
    const uint8_t sign8 = std::signbit(x) ? 0x80 : 0x00;
    const uint8_t e4m3_sat = (g.e4m3[i] & 0x7F) == 0x7F ? (sign8 | 0x7E) : g.e4m3[i];
    const uint8_t e5m2_sat = (g.e5m2[i] & 0x7F) == 0x7C ? (sign8 | 0x7B) : g.e5m2[i];
    EXPECT_EQ(f32_to_e4m3(x, Overflow::kSaturate), e4m3_sat) << "saturating e4m3 of " << x;
    EXPECT_EQ(f32_to_e5m2(x, Overflow::kSaturate), e5m2_sat) << "saturating e5m2 of " << x;
  }
  EXPECT_GT(checked, 10000u);
}

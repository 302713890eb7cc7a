// The load-time W4A8 weight transform (kernels::pack_w4a8_expert_weights, layout in grouped_gemm.h "W4A8").
// The expected values are computed here from the documented layout, independently of the packer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe {
namespace {

formats::QuantizedMatrix random_fp4_matrix(WeightFormat format, int64_t rows, int64_t cols, uint64_t seed) {
  formats::QuantizedMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  std::mt19937_64 rng(seed);
  m.data.resize(rows * cols / 2);
  for (auto& b : m.data) b = static_cast<uint8_t>(rng());
  const int group = format == WeightFormat::kNvfp4 ? 16 : 32;
  m.group_scales.resize(rows * cols / group);
  for (auto& s : m.group_scales) s = format == WeightFormat::kNvfp4 ? 0x20 + rng() % 0x30 : 120 + rng() % 8;
  if (format == WeightFormat::kNvfp4) m.global_scales = {0.375f, 3e-3f};
  return m;
}

// The code of value i (0..7) of a packed word, read back by the documented bit positions.
uint8_t unpack_code(uint32_t word, int i) {
  const uint32_t magnitude = i < 4 ? (word >> (4 * i)) & 7 : (word >> (16 + 4 * (i - 4))) & 7;
  const uint32_t sign = i < 4 ? (word >> (8 * i + 7)) & 1 : (word >> (8 * (i - 4) + 3)) & 1;
  return static_cast<uint8_t>(magnitude | (sign << 3));
}

struct Packed {
  std::vector<uint8_t> data, scales;
  std::vector<kernels::W4a8BlockScale> blocks;
};

Packed pack(const formats::QuantizedMatrix& m, kernels::GemmRole role) {
  const auto size = kernels::packed_w4a8_size(m.format, m.rows, m.cols);
  Packed p;
  p.data.resize(size.data_bytes);
  p.scales.resize(size.group_scale_bytes);
  p.blocks.resize(size.block_count);
  kernels::pack_w4a8_expert_weights(m, role, p.data.data(), p.scales.data(), p.blocks.data());
  return p;
}

void check_layout(WeightFormat format, kernels::GemmRole role, int64_t rows = 512, int64_t cols = 384) {
  SCOPED_TRACE(std::string(weight_format_name(format)) + (role == kernels::GemmRole::kGateUp ? " gate_up" : " down") +
               " " + std::to_string(rows) + " x " + std::to_string(cols));
  const auto m = random_fp4_matrix(format, rows, cols, 7);
  const Packed p = pack(m, role);
  const int group = format == WeightFormat::kNvfp4 ? 16 : 32, per_block = 128 / group;
  for (int64_t r = 0; r < rows; ++r) {
    // W13: packed 256-row tile j = gate rows 128j.. then up rows 128j.. (canonical up starts at rows/2).
    const int64_t pr = role == kernels::GemmRole::kDown ? r
                       : r < rows / 2                   ? (r / 128) * 256 + r % 128
                                                        : ((r - rows / 2) / 128) * 256 + 128 + r % 128;
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t word;
      std::memcpy(&word, p.data.data() + pr * (cols / 2) + (c / 8) * 4, 4);
      ASSERT_EQ(unpack_code(word, static_cast<int>(c % 8)), m.fp4_code(r, c)) << "r " << r << " c " << c;
    }
    for (int64_t g = 0; g < cols / group; ++g)
      ASSERT_EQ(p.scales[((g / per_block) * rows + pr) * per_block + g % per_block], m.group_scales[r * (cols / group) + g]);
  }
}

TEST(GroupedGemmW4a8Layout, CodesAndScalesLandWhereDocumented) {
  for (WeightFormat f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4})
    for (auto role : {kernels::GemmRole::kDown, kernels::GemmRole::kGateUp}) check_layout(f, role);
  // >= 2^22 weights: the packer splits the rows over the host's cores (row ranges end mid-tile).
  check_layout(WeightFormat::kNvfp4, kernels::GemmRole::kGateUp, 1280, 4096);
  check_layout(WeightFormat::kMxfp4, kernels::GemmRole::kDown, 1280, 3712);
}

// W4A8 v10 GEMM 1's W13 packing (kGateUpInterleaved8): packed row pr of 256-row tile j = pr / 256 holds canonical
// row half * I + 128 j + 8 (t / 16) + t % 8 (t = pr % 256, half = (t / 8) % 2: 0 gate, 1 up), FP8's rule
// (grouped_gemm_layout.cpp), with that row's codes and group scales; the block records are kGateUp's (the canonical
// gate / up blocks at 2 j / 2 j + 1), so the decoded bytes and factors are those of the old kernel's packing.
void check_interleaved8(WeightFormat format, int64_t rows, int64_t cols) {
  SCOPED_TRACE(std::string(weight_format_name(format)) + " interleaved8 " + std::to_string(rows) + " x " +
               std::to_string(cols));
  const auto m = random_fp4_matrix(format, rows, cols, 17);
  const Packed p = pack(m, kernels::GemmRole::kGateUpInterleaved8);
  const Packed reference = pack(m, kernels::GemmRole::kGateUp);
  const int group = format == WeightFormat::kNvfp4 ? 16 : 32, per_block = 128 / group;
  const int64_t intermediate = rows / 2;
  for (int64_t pr = 0; pr < rows; ++pr) {
    const int64_t j = pr / 256, t = pr % 256, half = (t / 8) % 2;
    const int64_t r = half * intermediate + 128 * j + 8 * (t / 16) + t % 8;
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t word;
      std::memcpy(&word, p.data.data() + pr * (cols / 2) + (c / 8) * 4, 4);
      ASSERT_EQ(unpack_code(word, static_cast<int>(c % 8)), m.fp4_code(r, c)) << "packed row " << pr << " c " << c;
    }
    for (int64_t g = 0; g < cols / group; ++g)
      ASSERT_EQ(p.scales[((g / per_block) * rows + pr) * per_block + g % per_block], m.group_scales[r * (cols / group) + g])
          << "packed row " << pr << " group " << g;
  }
  ASSERT_EQ(p.blocks.size(), reference.blocks.size());
  for (size_t i = 0; i < p.blocks.size(); ++i) {
    EXPECT_EQ(p.blocks[i].decode_exponent, reference.blocks[i].decode_exponent) << "record " << i;
    EXPECT_EQ(p.blocks[i].factor, reference.blocks[i].factor) << "record " << i;
  }
  // Every canonical row lands exactly once (a permutation): the data of both packings hold the same rows.
  std::vector<int> seen(rows, 0);
  for (int64_t pr = 0; pr < rows; ++pr) {
    const int64_t t = pr % 256;
    ++seen[(t / 8) % 2 * intermediate + 128 * (pr / 256) + 8 * (t / 16) + t % 8];
  }
  for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(seen[r], 1) << "canonical row " << r;
}

TEST(GroupedGemmW4a8Layout, GateUpInterleaved8MovesRowsKeepsBlockRecords) {
  for (WeightFormat f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4}) check_interleaved8(f, 512, 384);
  check_interleaved8(WeightFormat::kNvfp4, 256, 128);  // one tile
  // >= 2^22 weights: the packer's row split over the host's cores.
  check_interleaved8(WeightFormat::kMxfp4, 1280, 4096);
}

TEST(GroupedGemmW4a8Layout, DecodeExponentKeepsLargestValueInFp8Range) {
  // NVFP4, W2 role: block (0, 0) holds the E4M3 maximum 448 (6 * 448 = 2688 > 448): p = -3, 6*448/8 = 336.
  auto m = random_fp4_matrix(WeightFormat::kNvfp4, 256, 256, 9);
  m.global_scales = {0.5f, 0.5f};
  for (auto& s : m.group_scales) s = 0x38;  // 1.0 everywhere: 6 * 2^6 = 384 <= 448 < 768 -> p = 6
  m.group_scales[5] = 0x7E;                 // 448 in row 0, block (0, 0)
  for (int r = 128; r < 256; ++r)           // block (1, 1): all 2^-9 -> p = 15 (6 * 2^-9 * 2^15 = 384)
    for (int g = 8; g < 16; ++g) m.group_scales[r * 16 + g] = 0x01;
  const Packed p = pack(m, kernels::GemmRole::kDown);
  EXPECT_EQ(p.blocks[0].decode_exponent, -3);
  EXPECT_EQ(p.blocks[0].factor, 4.0f);  // 0.5 * 2^3
  EXPECT_EQ(p.blocks[1].decode_exponent, 6);
  EXPECT_EQ(p.blocks[2].decode_exponent, 6);
  EXPECT_EQ(p.blocks[3].decode_exponent, 15);
  EXPECT_EQ(p.blocks[3].factor, std::ldexp(0.5f, -15));
  // MXFP4: scales 2^-3 .. 2^4 in a block -> p = 6 - 4 = 2; a block of 2^-127 only -> p = 133, factor 2^-133.
  auto x = random_fp4_matrix(WeightFormat::kMxfp4, 256, 256, 10);
  for (auto& s : x.group_scales) s = 124;
  x.group_scales[0] = 131;
  for (int r = 128; r < 256; ++r)
    for (int g = 4; g < 8; ++g) x.group_scales[r * 8 + g] = 0;
  const Packed q = pack(x, kernels::GemmRole::kDown);
  EXPECT_EQ(q.blocks[0].decode_exponent, 2);
  EXPECT_EQ(q.blocks[0].factor, 0.25f);
  EXPECT_EQ(q.blocks[1].decode_exponent, 9);  // max 2^-3
  EXPECT_EQ(q.blocks[3].decode_exponent, 133);
  EXPECT_EQ(q.blocks[3].factor, std::ldexp(1.0f, -133));
}

TEST(GroupedGemmW4a8Layout, RejectsNanScalesAndBadShapes) {
  auto m = random_fp4_matrix(WeightFormat::kNvfp4, 256, 128, 11);
  m.group_scales[3 * 8 + 2] = 0xFF;
  try {
    pack(m, kernels::GemmRole::kDown);
    FAIL() << "NaN scale accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("group_scales[3, 2]"), std::string::npos) << error.what();
  }
  auto x = random_fp4_matrix(WeightFormat::kMxfp4, 256, 128, 12);
  x.group_scales[7] = 255;
  EXPECT_THROW(pack(x, kernels::GemmRole::kDown), Error);
  try {
    kernels::packed_w4a8_size(WeightFormat::kNvfp4, 384, 128);
    FAIL() << "384 rows accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("rows = 384"), std::string::npos) << error.what();
  }
  EXPECT_THROW(kernels::packed_w4a8_size(WeightFormat::kFp8Block, 256, 128), Error);
  try {
    pack(random_fp4_matrix(WeightFormat::kMxfp4, 256, 128, 13), static_cast<kernels::GemmRole>(99));
    FAIL() << "role 99 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("must be kGateUp, kGateUpInterleaved8 or kDown"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace megamoe

// The host-side weight-layout transform of the grouped GEMMs (src/kernels/grouped_gemm.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "common/fp8_codec.h"
#include "kernels/grouped_gemm.h"
#include "kernels/sm90_gemm_heuristics.h"
#include "megamoe/formats.h"
#include "megamoe/error.h"

namespace megamoe {
namespace {

formats::QuantizedMatrix random_fp8_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  formats::QuantizedMatrix m;
  m.format = WeightFormat::kFp8Block;
  m.rows = rows;
  m.cols = cols;
  std::mt19937_64 rng(seed);
  m.data.resize(rows * cols);
  for (auto& b : m.data) b = static_cast<uint8_t>(rng() & 0x7E);
  m.block_scales.resize((rows / 128) * (cols / 128));
  std::uniform_real_distribution<float> scale(0.1f, 2.0f);
  for (auto& s : m.block_scales) s = scale(rng);
  return m;
}

TEST(GroupedGemmLayout, GateUpInterleavesBlocksOf128Rows) {
  const int64_t intermediate = 384, hidden = 256;
  const auto m = random_fp8_matrix(2 * intermediate, hidden, 3);
  const auto size = kernels::packed_weight_bytes(WeightFormat::kFp8Block, m.rows, m.cols);
  ASSERT_EQ(size.data_bytes, static_cast<size_t>(m.rows * m.cols));
  ASSERT_EQ(size.scale_count, static_cast<size_t>((m.rows / 128) * (m.cols / 128)));
  std::vector<uint8_t> data(size.data_bytes);
  std::vector<float> scales(size.scale_count);
  kernels::pack_expert_weights(m, kernels::GemmRole::kGateUp, data.data(), scales.data());
  const int64_t k_blocks = hidden / 128;
  for (int64_t packed_row = 0; packed_row < m.rows; ++packed_row) {
    const int64_t j = packed_row / 256, i = packed_row % 256;
    const int64_t canonical_row = i < 128 ? 128 * j + i : intermediate + 128 * j + (i - 128);
    for (int64_t c = 0; c < hidden; ++c)
      ASSERT_EQ(data[packed_row * hidden + c], m.data[canonical_row * hidden + c]) << "packed row " << packed_row;
    for (int64_t kb = 0; kb < k_blocks; ++kb)
      ASSERT_EQ(scales[(packed_row / 128) * k_blocks + kb], m.block_scales[(canonical_row / 128) * k_blocks + kb]);
  }
}

TEST(GroupedGemmLayout, DownIsCanonical) {
  const auto m = random_fp8_matrix(256, 384, 4);
  std::vector<uint8_t> data(m.data.size());
  std::vector<float> scales(m.block_scales.size());
  kernels::pack_expert_weights(m, kernels::GemmRole::kDown, data.data(), scales.data());
  EXPECT_EQ(data, m.data);
  EXPECT_EQ(scales, m.block_scales);
}

void expect_error(const formats::QuantizedMatrix& m, kernels::GemmRole role, const std::string& needle) {
  std::vector<uint8_t> data(m.rows * m.cols + 1);
  std::vector<float> scales(m.rows * m.cols + 1);
  try {
    kernels::pack_expert_weights(m, role, data.data(), scales.data());
    ADD_FAILURE() << "accepted; expected an error mentioning '" << needle << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(GroupedGemmLayout, RejectsBadMatrices) {
  auto m = random_fp8_matrix(384, 256, 5);
  expect_error(m, kernels::GemmRole::kGateUp, "must be a multiple of 256");  // 2I = 384: I not a multiple of 128
  auto short_data = random_fp8_matrix(256, 256, 6);
  short_data.data.pop_back();
  expect_error(short_data, kernels::GemmRole::kDown, "canonical.data has");
  auto bad_scales = random_fp8_matrix(256, 256, 7);
  bad_scales.block_scales.push_back(1.0f);
  expect_error(bad_scales, kernels::GemmRole::kDown, "canonical.block_scales has");
  auto nvfp4 = random_fp8_matrix(256, 256, 8);
  nvfp4.format = WeightFormat::kNvfp4;
  expect_error(nvfp4, kernels::GemmRole::kDown, "not supported yet");
  auto ragged = random_fp8_matrix(256, 256, 9);
  ragged.cols = 200;
  expect_error(ragged, kernels::GemmRole::kDown, "weight cols = 200");
}

// v9 layout (kGateUpInterleaved8): every canonical row lands exactly once (round trip back to the
// canonical matrix), in the position the v9 kernel's fragment arithmetic assumes, and the scales are
// kGateUp's: packed block 2j = gate block j, 2j + 1 = up block j, each the canonical block of its rows.
TEST(GroupedGemmLayout, GateUpInterleaved8RoundTripAndFragmentPairs) {
  const int64_t intermediate = 384, hidden = 256;
  const auto m = random_fp8_matrix(2 * intermediate, hidden, 13);
  const auto size = kernels::packed_weight_bytes(WeightFormat::kFp8Block, m.rows, m.cols);
  std::vector<uint8_t> data(size.data_bytes, 0xAB);
  std::vector<float> scales(size.scale_count, -1.0f);
  kernels::pack_expert_weights(m, kernels::GemmRole::kGateUpInterleaved8, data.data(), scales.data());
  // Where the kernel expects canonical row `row` (gate: row < I; up: row >= I): output column o = row % I
  // of n-tile o / 128, packed columns 128 n + 8 jf + 2 q + c of the m64n128 fragment with gate at even
  // jf and up at jf + 1 (sm90_fp8_grouped_gemm.cuh, swiglu_quant_fp8_rows_epilogue): o % 128 = 64 n + 8 p + t.
  const auto packed_position = [&](int64_t row) {
    const bool up = row >= intermediate;
    const int64_t o = row % intermediate, tile = o / 128, c = o % 128;
    const int64_t n = c / 64, p = (c % 64) / 8, t = c % 8;
    const int64_t fragment_group = 2 * p + (up ? 1 : 0);  // jf
    return 256 * tile + 128 * n + 8 * fragment_group + t;
  };
  std::vector<uint8_t> unpacked(m.data.size(), 0);
  std::vector<int> hits(m.rows, 0);
  for (int64_t row = 0; row < m.rows; ++row) {
    const int64_t packed_row = packed_position(row);
    ASSERT_LT(packed_row, m.rows);
    ++hits[packed_row];
    std::copy_n(data.begin() + packed_row * hidden, hidden, unpacked.begin() + row * hidden);
  }
  for (int64_t r = 0; r < m.rows; ++r) ASSERT_EQ(hits[r], 1) << "packed row " << r;
  EXPECT_EQ(unpacked, m.data) << "round trip through the fragment mapping";
  // The gate and up rows of one output sit 8 rows apart in the same 128-row n-half.
  for (int64_t o = 0; o < intermediate; ++o) {
    const int64_t g = packed_position(o), u = packed_position(intermediate + o);
    EXPECT_EQ(u, g + 8);
    EXPECT_EQ(g / 128, u / 128);
    EXPECT_EQ((g % 128) / 8 % 2, 0);
  }
  const int64_t k_blocks = hidden / 128, blocks = intermediate / 128;
  std::vector<uint8_t> split_n_data(size.data_bytes);
  std::vector<float> split_n_scales(size.scale_count);
  kernels::pack_expert_weights(m, kernels::GemmRole::kGateUp, split_n_data.data(), split_n_scales.data());
  EXPECT_EQ(scales, split_n_scales);
  for (int64_t j = 0; j < blocks; ++j)
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      EXPECT_EQ(scales[(2 * j) * k_blocks + kb], m.block_scales[j * k_blocks + kb]);
      EXPECT_EQ(scales[(2 * j + 1) * k_blocks + kb], m.block_scales[(blocks + j) * k_blocks + kb]);
    }
  // The W13 shape rule as kGateUp (BF16 is accepted: GroupedGemmLayout.Bf16GateUpInterleaved8RoundTrip).
  expect_error(random_fp8_matrix(384, 256, 14), kernels::GemmRole::kGateUpInterleaved8, "must be a multiple of 256");
}

// BF16 v2 GEMM-1 layout (kGateUpInterleaved8 on bf16, docs/grouped_gemm.md "BF16 v2"): the row order of
// the FP8 v9 layout with 2-byte elements, no scales. Round trip through the position the BF16 v2
// epilogue (swiglu_interleaved_bf16_activate) assumes: output column o of n-tile o / 128, o % 128 =
// 8 m + t with m = 8 h + p (h: the wide fragment's 128-column half, p: the pair index), gate at
// packed column 128 h + 8 (2p) + t, up at 128 h + 8 (2p + 1) + t of the 256-column tile.
TEST(GroupedGemmLayout, Bf16GateUpInterleaved8RoundTrip) {
  const int64_t intermediate = 384, hidden = 128;
  formats::QuantizedMatrix m;
  m.format = WeightFormat::kBf16;
  m.rows = 2 * intermediate;
  m.cols = hidden;
  std::mt19937_64 rng(15);
  m.data.resize(m.rows * m.cols * 2);
  for (auto& b : m.data) b = static_cast<uint8_t>(rng());
  const auto size = kernels::packed_weight_bytes(WeightFormat::kBf16, m.rows, m.cols);
  ASSERT_EQ(size.scale_count, 0u);
  std::vector<uint8_t> data(size.data_bytes, 0xAB);
  kernels::pack_expert_weights(m, kernels::GemmRole::kGateUpInterleaved8, data.data(), nullptr);
  const int64_t row_bytes = 2 * hidden;
  const auto packed_position = [&](int64_t row) {
    const bool up = row >= intermediate;
    const int64_t o = row % intermediate, tile = o / 128, column = o % 128;
    const int64_t mm = column / 8, t = column % 8, h = mm / 8, p = mm % 8;
    return 256 * tile + 128 * h + 8 * (2 * p + (up ? 1 : 0)) + t;
  };
  std::vector<uint8_t> unpacked(m.data.size(), 0);
  std::vector<int> hits(m.rows, 0);
  for (int64_t row = 0; row < m.rows; ++row) {
    const int64_t packed_row = packed_position(row);
    ASSERT_LT(packed_row, m.rows);
    ++hits[packed_row];
    std::copy_n(data.begin() + packed_row * row_bytes, row_bytes, unpacked.begin() + row * row_bytes);
  }
  for (int64_t r = 0; r < m.rows; ++r) ASSERT_EQ(hits[r], 1) << "packed row " << r;
  EXPECT_EQ(unpacked, m.data) << "round trip through the BF16 v2 fragment mapping";
  // Same row order as the FP8 v9 packing (one element = 2 bytes here, 1 there).
  formats::QuantizedMatrix fp8 = random_fp8_matrix(m.rows, 256, 16);
  std::vector<uint8_t> fp8_data(fp8.data.size());
  std::vector<float> fp8_scales(fp8.block_scales.size());
  kernels::pack_expert_weights(fp8, kernels::GemmRole::kGateUpInterleaved8, fp8_data.data(), fp8_scales.data());
  for (int64_t row = 0; row < m.rows; ++row)
    ASSERT_EQ(0, std::memcmp(fp8_data.data() + packed_position(row) * 256, fp8.data.data() + row * 256, 256)) << row;
  // Still no scales, and the W13 shape rule.
  m.block_scales.push_back(1.0f);
  expect_error(m, kernels::GemmRole::kGateUpInterleaved8, "bf16 has no scales");
  m.block_scales.clear();
  m.rows = 384;
  m.data.resize(m.rows * m.cols * 2);
  expect_error(m, kernels::GemmRole::kGateUpInterleaved8, "must be a multiple of 256");
}

TEST(GroupedGemmLayout, Bf16GateUpInterleavesRowsAndHasNoScales) {
  const int64_t intermediate = 256, hidden = 128;
  formats::QuantizedMatrix m;
  m.format = WeightFormat::kBf16;
  m.rows = 2 * intermediate;
  m.cols = hidden;
  std::mt19937_64 rng(12);
  m.data.resize(m.rows * m.cols * 2);
  for (auto& b : m.data) b = static_cast<uint8_t>(rng());
  const auto size = kernels::packed_weight_bytes(WeightFormat::kBf16, m.rows, m.cols);
  ASSERT_EQ(size.data_bytes, m.data.size());
  ASSERT_EQ(size.scale_count, 0u);
  std::vector<uint8_t> data(size.data_bytes);
  kernels::pack_expert_weights(m, kernels::GemmRole::kGateUp, data.data(), nullptr);
  const int64_t row_bytes = 2 * hidden;
  for (int64_t packed_row = 0; packed_row < m.rows; ++packed_row) {
    const int64_t j = packed_row / 256, i = packed_row % 256;
    const int64_t canonical_row = i < 128 ? 128 * j + i : intermediate + 128 * j + (i - 128);
    for (int64_t b = 0; b < row_bytes; ++b)
      ASSERT_EQ(data[packed_row * row_bytes + b], m.data[canonical_row * row_bytes + b]) << "packed row " << packed_row;
  }
  std::vector<uint8_t> down(size.data_bytes);
  kernels::pack_expert_weights(m, kernels::GemmRole::kDown, down.data(), nullptr);
  EXPECT_EQ(down, m.data);
  m.block_scales.push_back(1.0f);
  expect_error(m, kernels::GemmRole::kDown, "bf16 has no scales");
}

// The GPU tests judge the kernels with their own E4M3/BF16 codec; it must agree with formats.h.
TEST(GroupedGemmTestCodec, AgreesWithFormats) {
  for (int code = 0; code < 256; ++code) {
    const float mine = testing::e4m3_decode(static_cast<uint8_t>(code));
    const float theirs = formats::e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(theirs)) {
      EXPECT_TRUE(std::isnan(mine)) << "code " << code;
    } else {
      EXPECT_EQ(mine, theirs) << "code " << code;
      EXPECT_EQ(std::signbit(mine), std::signbit(theirs)) << "code " << code;
    }
  }
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> uniform(-500.0f, 500.0f);
  std::uniform_int_distribution<int> exponent(-14, 9);
  for (int i = 0; i < 200000; ++i) {
    float value = uniform(rng);
    if (i % 2) value = std::ldexp(value / 500.0f, exponent(rng));
    if (i % 7 == 0) {  // exact midpoints between neighbouring codes: ties to even
      const int code = static_cast<int>(rng() % 0x7E);
      value = 0.5f * (formats::e4m3_to_f32(static_cast<uint8_t>(code)) + formats::e4m3_to_f32(static_cast<uint8_t>(code + 1)));
      if (rng() & 1) value = -value;
    }
    ASSERT_EQ(testing::e4m3_encode(value), formats::f32_to_e4m3(value)) << "value " << value;
    ASSERT_EQ(testing::bf16_round(value), formats::f32_to_bf16(value)) << "value " << value;
  }
}

// v11 (sm90_fp8_wide_grouped_gemm.cuh): the B block scale the kernel applies to every stored column of every
// 128 x block_n tile is the column's own 128-column block (the canonical scale layout).
TEST(GroupedGemmV11, TileColumnsTakeTheirOwnBlockScale) {
  for (const int block_n : {128, 192})
    for (int n = 128; n <= 7168; n += 128) {
      const int n_tiles = (n + block_n - 1) / block_n;
      for (int t = 0; t < n_tiles; ++t) {
        const int n0 = t * block_n;
        const int former = kernels::sm90::wide_former_groups(block_n, n0);
        const int second = kernels::sm90::wide_second_block(n0, n);
        ASSERT_GE(second, 0);
        ASSERT_LT(second, n / 128);
        ASSERT_TRUE(block_n == 128 ? former == 16 : (former == 16 || former == 8)) << "n0 " << n0;
        for (int c = n0; c < std::min(n0 + block_n, n); ++c) {
          const int block = (c - n0) / 8 < former ? n0 / 128 : second;
          ASSERT_EQ(block, c / 128) << "block_n " << block_n << " n " << n << " column " << c;
        }
      }
    }
}

TEST(GroupedGemmV11, Selection) {
  using kernels::sm90::resolve_v11_block_n;
  EXPECT_EQ(resolve_v11_block_n(-1, 0, nullptr, nullptr), 0);  // default off
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "", ""), 0);
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "0", "128"), 0);
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "1", nullptr), 192);  // default width
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "1", "128"), 128);
  EXPECT_EQ(resolve_v11_block_n(-1, 128, "1", "192"), 128);  // the argument wins over the variable
  EXPECT_EQ(resolve_v11_block_n(1, 0, "0", "192"), 192);     // so does v11
  EXPECT_EQ(resolve_v11_block_n(0, 192, "1", "192"), 0);
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "yes", nullptr), -1);
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "1", "256"), -1);
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "1", "1280"), -1);
  EXPECT_EQ(resolve_v11_block_n(1, 256, nullptr, nullptr), -1);
  EXPECT_EQ(resolve_v11_block_n(2, 0, nullptr, nullptr), -1);
  EXPECT_EQ(resolve_v11_block_n(0, 256, nullptr, nullptr), 0);  // off: the width is not looked at
  // Unset variable: the heuristic's choice (prefer_fp8_v11), which the variable and the argument override.
  EXPECT_EQ(resolve_v11_block_n(-1, 0, nullptr, nullptr, true), 192);
  EXPECT_EQ(resolve_v11_block_n(-1, 128, "", nullptr, true), 128);
  EXPECT_EQ(resolve_v11_block_n(-1, 0, "0", nullptr, true), 0);
  EXPECT_EQ(resolve_v11_block_n(0, 0, nullptr, nullptr, true), 0);
  using kernels::sm90::prefer_fp8_v11;
  EXPECT_TRUE(prefer_fp8_v11(0, 32, 7168));     // unknown rows: large tiles
  EXPECT_TRUE(prefer_fp8_v11(33, 32, 7168));
  EXPECT_TRUE(prefer_fp8_v11(4096, 128, 2048));
  EXPECT_FALSE(prefer_fp8_v11(32, 32, 7168));   // small groups keep the 64-row tiles of the v8-v10 kernels
  EXPECT_FALSE(prefer_fp8_v11(8, 256, 7168));
  EXPECT_FALSE(prefer_fp8_v11(256, 1, 128));    // a 192-row B box would not fit 128 rows of weights
  EXPECT_TRUE(prefer_fp8_v11(256, 2, 128));
}

}  // namespace
}  // namespace megamoe

// FP8 GEMM 1's split-N tile: the 64-row tile only up to a mean of kFp8Gemm1SmallRowsLimit = 56 rows per expert (a
// mean of 64 leaves about half the experts above 64 rows, where a 64-row tile reads their weights twice); BF16 / W4A8
// keep 64.
TEST(GroupedGemmHeuristics, Fp8Gemm1SmallTileOnlyUpToAMeanOf56Rows) {
  using namespace megamoe::kernels::sm90;
  EXPECT_EQ(choose_gate_up_tile(8, 256, 4096, 132, kFp8Gemm1SmallRowsLimit).sub_tiles_m, 1);
  EXPECT_EQ(choose_gate_up_tile(32, 256, 4096, 132, kFp8Gemm1SmallRowsLimit).sub_tiles_m, 1);
  EXPECT_EQ(choose_gate_up_tile(56, 256, 4096, 132, kFp8Gemm1SmallRowsLimit).sub_tiles_m, 1);
  EXPECT_EQ(choose_gate_up_tile(57, 256, 4096, 132, kFp8Gemm1SmallRowsLimit).sub_tiles_m, 2);
  EXPECT_EQ(choose_gate_up_tile(64, 256, 4096, 132, kFp8Gemm1SmallRowsLimit).sub_tiles_m, 2);
  EXPECT_EQ(choose_gate_up_tile(64, 256, 4096, 132).sub_tiles_m, 1);  // the default limit (BF16, W4A8)
  EXPECT_EQ(choose_gate_up_tile(0, 256, 4096, 132, kFp8Gemm1SmallRowsLimit).sub_tiles_m, 2);
}

// v11 GEMM 1 small (docs/grouped_gemm.md "v11 GEMM 1 small"): on kGateUpInterleaved8 weights the 64 x 256 split-N tile
// for rows hints in (0, kFp8Gemm1SmallRowsLimit] (on since session 13 call 4, kFp8Gemm1V11SmallDefault); never for an
// unknown hint or above the limit.
TEST(GroupedGemmHeuristics, Fp8Gemm1V11SmallOnlyForSmallKnownHints) {
  using namespace megamoe::kernels::sm90;
  for (const int hint : {-1, 0, 1, 8, 32, 56, 57, 64, 128, 4096}) {
    const bool in_window = hint > 0 && hint <= kFp8Gemm1SmallRowsLimit;
    EXPECT_EQ(prefer_fp8_gemm1_v11_small(hint), kFp8Gemm1V11SmallDefault && in_window) << "hint " << hint;
  }
  EXPECT_TRUE(prefer_fp8_gemm1_v11_small(8));
  EXPECT_FALSE(prefer_fp8_gemm1_v11_small(0));
  EXPECT_FALSE(prefer_fp8_gemm1_v11_small(kFp8Gemm1SmallRowsLimit + 1));
}

// `megamoe bench layer` helpers linked directly (bench/layer_bench.cpp): the NVLink bytes of rank 0
// behind "NVLink GB/s" and the floor, against hand-counted routings, and the split column's text.
#include <gtest/gtest.h>

#include <vector>

#include "bench/layer_bench.h"
#include "megamoe/error.h"

namespace megamoe::bench {
namespace {

// H 256, I 128, E 8, top-2 on 2 ranks: rank 0 holds experts 0-3, rank 1 experts 4-7. Every rank
// routes the same five tokens:
//   t0 {0, 1}   rank 0 only      t1 {0, 5}  both ranks      t2 {6, 7}  rank 1 only
//   t3 {4, -1}  rank 1 only      t4 {-1, -1} nowhere
// Rank 0 sends its t1, t2, t3 to rank 1 (3 dispatch rows) and gets back 3 BF16 partials; it receives
// rank 1's t0, t1 (2 dispatch rows) and returns 2 partials.
const LayerShape kShape{"hand", 256, 128, 8, 2};
const std::vector<int32_t> kIds = {0, 1, 0, 5, 6, 7, 4, -1, -1, -1};

TEST(BenchLayerNvlinkBytes, HandCountedTwoRanks) {
  const double fp8_row = 256 + 4 * (256 / 128), bf16_row = 2 * 256;  // FP8 row + per-128 f32 scales
  const LayerNvlinkBytes fp8 = layer_nvlink_bytes(kShape, WeightFormat::kFp8Block, 2, kIds, 0);
  EXPECT_EQ(fp8.out, 3 * fp8_row + 2 * bf16_row);  // 1816
  EXPECT_EQ(fp8.in, 2 * fp8_row + 3 * bf16_row);   // 2064
  const LayerNvlinkBytes fp8_rank1 = layer_nvlink_bytes(kShape, WeightFormat::kFp8Block, 2, kIds, 1);
  EXPECT_EQ(fp8_rank1.out, fp8.in) << "rank 1 mirrors rank 0: same tokens everywhere";
  EXPECT_EQ(fp8_rank1.in, fp8.out);
  const LayerNvlinkBytes bf16 = layer_nvlink_bytes(kShape, WeightFormat::kBf16, 2, kIds, 0);
  EXPECT_EQ(bf16.out, 5 * bf16_row);
  EXPECT_EQ(bf16.in, 5 * bf16_row);
  // The floor's NVLink term is the same count: the busier direction of the busier rank at 370 GB/s.
  const LayerFloor floor = layer_floor(kShape, WeightFormat::kFp8Block, 2, kIds);
  EXPECT_DOUBLE_EQ(floor.nvlink_us, 2064 / 370e9 * 1e6);
}

TEST(BenchLayerNvlinkBytes, OneRankMovesNothingAndBadRankIsAnError) {
  const LayerNvlinkBytes one = layer_nvlink_bytes(kShape, WeightFormat::kFp8Block, 1, kIds, 0);
  EXPECT_EQ(one.out, 0.0);
  EXPECT_EQ(one.in, 0.0);
  try {
    layer_nvlink_bytes(kShape, WeightFormat::kFp8Block, 2, kIds, 2);
    ADD_FAILURE() << "rank 2 of 2 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank = 2 must be in [0, 2)"), std::string::npos) << e.what();
  }
}

TEST(BenchLayerNvlinkBytes, SplitText) {
  EXPECT_EQ(phase_split_text({}), "-");
  const std::vector<MoeBackend::PhaseTime> phases = {
      {"dispatch", 410.4}, {"gemm1", 4049.6}, {"gemm2", 2030}, {"combine", 900.2}};
  EXPECT_EQ(phase_split_text(phases), "disp 410 / g1 4050 / g2 2030 / comb 900");
}

}  // namespace
}  // namespace megamoe::bench

// ExpertSlabs::bytes and the requests of ExpertSlabs::allocate / with_own_gate_up, and staged_gate_up_packing per
// format and W4A8 GEMM-1 switch (host side only: the alloc callback records sizes, nothing touches a device). The byte counts are written out here from the
// layouts of docs (FP8 per-128x128 scales, BF16 2 bytes per element, W4A8 packed_w4a8_size).
#if MEGAMOE_WITH_CUDA
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/scoped_overrides.h"
#include "kernels/grouped_gemm.h"
#include "megamoe/error.h"
#include "moe/staged_pipeline.h"

namespace megamoe {
namespace {

MoeConfig config_of(WeightFormat format) {
  MoeConfig c;
  c.hidden = 1024;
  c.intermediate = 384;
  c.num_experts = 16;
  c.top_k = 2;
  c.weight_format = format;
  return c;
}

// Every request of `alloc` in order; returns fake pointers (never dereferenced), distinct across recorders with
// different `base`.
struct RecordingAlloc {
  uintptr_t base = 1 << 20;
  std::vector<size_t> sizes;
  void* operator()(size_t bytes) {
    sizes.push_back(bytes);
    return reinterpret_cast<void*>(base + 4096 * sizes.size());
  }
};

TEST(ExpertSlabs, AllocateRequestsTheBytesOfEverySlabInOrder) {
  const int E = 3;
  const int64_t H = 1024, I = 384;
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(format)));
    const MoeConfig c = config_of(format);
    const ExpertSlabs::Bytes b = ExpertSlabs::bytes(c, E);
    RecordingAlloc rec;
    const ExpertSlabs s =
        ExpertSlabs::allocate(c, E, kernels::GemmRole::kGateUp, [&](size_t n) { return rec(n); });
    std::vector<size_t> expected;
    if (format == WeightFormat::kBf16) {
      expected = {size_t(E * 2 * I * H * 2), size_t(E * H * I * 2)};
      EXPECT_EQ(b.gate_up_total(), expected[0]);
    } else if (format == WeightFormat::kFp8Block) {
      expected = {size_t(E * 2 * I * H), size_t(E * H * I), size_t(4 * E * (2 * I / 128) * (H / 128)),
                  size_t(4 * E * (H / 128) * (I / 128))};
      EXPECT_EQ(b.gate_up_total(), expected[0] + expected[2]);
      EXPECT_EQ(b.down_total(), expected[1] + expected[3]);
      EXPECT_NE(s.w13_scales, nullptr);
    } else {
      const kernels::PackedW4a8Size s13 = kernels::packed_w4a8_size(format, 2 * I, H);
      const kernels::PackedW4a8Size s2 = kernels::packed_w4a8_size(format, H, I);
      expected = {size_t(E * s13.data_bytes), size_t(E * s2.data_bytes), size_t(E * s13.group_scale_bytes),
                  size_t(E * s2.group_scale_bytes), E * s13.block_count * sizeof(kernels::W4a8BlockScale),
                  E * s2.block_count * sizeof(kernels::W4a8BlockScale)};
      EXPECT_EQ(b.gate_up_total(), expected[0] + expected[2] + expected[4]);
      EXPECT_NE(s.w2_blocks, nullptr);
    }
    EXPECT_EQ(rec.sizes, expected);
  }
}

// W4A8 (mega with MEGAMOE_MEGA_OWN_GATE_UP=1 and the interleaved W13): the three W13 slabs (data, group scales,
// block records) are the copy's own, W2's three are shared.
TEST(ExpertSlabs, OwnGateUpRequestsOnlyTheW13Slabs) {
  const int E = 2;
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(std::string(weight_format_name(format)));
    const MoeConfig c = config_of(format);
    const ExpertSlabs::Bytes b = ExpertSlabs::bytes(c, E);
    RecordingAlloc first{1 << 20, {}}, second{2 << 20, {}};
    const ExpertSlabs s = ExpertSlabs::allocate(c, E, kernels::GemmRole::kGateUp, [&](size_t n) { return first(n); });
    const ExpertSlabs own = s.with_own_gate_up(c, E, kernels::GemmRole::kGateUpInterleaved8,
                                               [&](size_t n) { return second(n); });
    std::vector<size_t> expected = {b.w13};
    if (format == WeightFormat::kFp8Block) expected.push_back(b.w13_scales);
    if (format == WeightFormat::kNvfp4 || format == WeightFormat::kMxfp4) {
      expected.push_back(b.w13_group_scales);
      expected.push_back(b.w13_blocks);
      EXPECT_NE(own.w13_group_scales, s.w13_group_scales);
      EXPECT_NE(own.w13_blocks, s.w13_blocks);
      EXPECT_EQ(own.w2_group_scales, s.w2_group_scales);
      EXPECT_EQ(own.w2_blocks, s.w2_blocks);
    }
    EXPECT_EQ(second.sizes, expected);
    EXPECT_EQ(own.w2, s.w2);  // W2 shared
    EXPECT_NE(own.w13, s.w13);
    EXPECT_EQ(own.gate_up_packing, kernels::GemmRole::kGateUpInterleaved8);
    EXPECT_EQ(s.gate_up_packing, kernels::GemmRole::kGateUp);
  }
}

using testing::ScopedSwitch;

// staged_gate_up_packing for W4A8 is kernels::w4a8_gemm1_packing (MEGAMOE_W4A8_G1_V10: 0 kGateUp, 1
// kGateUpInterleaved8); FP8-block and BF16 do not depend on that switch.
TEST(ExpertSlabs, StagedGateUpPackingFollowsTheW4a8Gemm1Switch) {
  const ScopedSwitch restore(kernels::w4a8_g1_v10, kernels::set_w4a8_g1_v10);
  kernels::set_w4a8_g1_v10(0);
  const kernels::GemmRole fp8 = staged_gate_up_packing(config_of(WeightFormat::kFp8Block), false);
  const kernels::GemmRole bf16 = staged_gate_up_packing(config_of(WeightFormat::kBf16), false);
  for (int v10 : {0, 1}) {
    SCOPED_TRACE("MEGAMOE_W4A8_G1_V10=" + std::to_string(v10));
    kernels::set_w4a8_g1_v10(v10);
    const kernels::GemmRole w4a8 = v10 == 1 ? kernels::GemmRole::kGateUpInterleaved8 : kernels::GemmRole::kGateUp;
    EXPECT_EQ(staged_gate_up_packing(config_of(WeightFormat::kNvfp4), false), w4a8);
    EXPECT_EQ(staged_gate_up_packing(config_of(WeightFormat::kMxfp4), false), w4a8);
    EXPECT_EQ(kernels::w4a8_gemm1_packing(), w4a8);
    EXPECT_EQ(staged_gate_up_packing(config_of(WeightFormat::kFp8Block), false), fp8);
    EXPECT_EQ(staged_gate_up_packing(config_of(WeightFormat::kFp8Block), true), kernels::GemmRole::kGateUp);
    EXPECT_EQ(staged_gate_up_packing(config_of(WeightFormat::kBf16), false), bf16);
  }
  EXPECT_THROW(kernels::set_w4a8_g1_v10(2), Error);
}

}  // namespace
}  // namespace megamoe
#endif  // MEGAMOE_WITH_CUDA

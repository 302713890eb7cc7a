// CPU checks of the wgmma probe's host side (src/kernels/wgmma_probe.h): the fragment reference follows
// the wgmma accumulator layout (checked on operands whose products are known by construction), the
// random operands are non-zero E4M3, and the configuration table is consistent.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "kernels/wgmma_probe.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe {
namespace {

constexpr uint8_t kOne = 0x38;  // E4M3 1.0

// A row r = unit vector at k = r % 128; B row c holds E4M3 code (c + k) % 64 + 0x20 at k (never zero):
// product(r, c) = B[c][r % 128] exactly.
TEST(WgmmaProbeReference, FollowsAccumulatorLayout) {
  kernels::WgmmaProbeInputs inputs = kernels::wgmma_probe_random_inputs(7);
  std::fill(inputs.a.begin(), inputs.a.end(), 0);
  for (int r = 0; r < kernels::kWgmmaProbeARows; ++r) inputs.a[r * 128 + r % 128] = kOne;
  for (int c = 0; c < kernels::kWgmmaProbeBRows; ++c)
    for (int k = 0; k < 128; ++k) inputs.b[c * 128 + k] = static_cast<uint8_t>((c + k) % 64 + 0x20);
  const auto b_value = [&](int c, int k) { return static_cast<double>(formats::e4m3_to_f32(inputs.b[c * 128 + k])); };
  constexpr int kIterations = 3;
  for (const kernels::WgmmaProbeConfig& config : kernels::wgmma_probe_configs()) {
    if (config.pattern != kernels::WgmmaProbePattern::kThroughput &&
        config.pattern != kernels::WgmmaProbePattern::kThroughputN256)
      continue;
    const auto shape = kernels::wgmma_probe_shape(config);
    const std::vector<double> got =
        kernels::wgmma_probe_reference(config, inputs.a, inputs.b, inputs.scales, kIterations);
    const bool n256 = config.pattern == kernels::WgmmaProbePattern::kThroughputN256;
    for (int w = 0; w < config.warpgroups; ++w)
      for (int t = 0; t < 128; ++t)
        for (int r = 0; r < shape.fragment_registers; ++r) {
          const int s = n256 ? 0 : r / 64, i = n256 ? r : r % 64;
          // spelled out differently from the reference: thread t's quad row, column pair
          const int row = (t / 32) * 16 + (t % 32) / 4 + ((i & 2) ? 8 : 0);
          const int column = (i >> 2) * 8 + (t % 4) * 2 + (i & 1);
          const int a_row = (w * config.sub_tiles + s) * 64 + row;
          ASSERT_EQ(got[(w * 128 + t) * shape.fragment_registers + r], kIterations * b_value(column, a_row % 128))
              << kernels::wgmma_probe_label(config) << " w" << w << " t" << t << " r" << r;
        }
  }
}

TEST(WgmmaProbeReference, PromotedPatternsApplyScales) {
  const kernels::WgmmaProbeInputs inputs = kernels::wgmma_probe_random_inputs(11);
  constexpr int kIterations = 17;  // wraps the 16-row scale table
  const kernels::WgmmaProbeConfig throughput{kernels::WgmmaProbePattern::kThroughput, 2, 2};
  const kernels::WgmmaProbeConfig promote{kernels::WgmmaProbePattern::kPromote, 2, 2};
  const kernels::WgmmaProbeConfig halves{kernels::WgmmaProbePattern::kOverlapHalves, 2, 2};
  const std::vector<double> raw = kernels::wgmma_probe_reference(throughput, inputs.a, inputs.b, inputs.scales, 1);
  const std::vector<double> scaled = kernels::wgmma_probe_reference(promote, inputs.a, inputs.b, inputs.scales, kIterations);
  EXPECT_EQ(scaled, kernels::wgmma_probe_reference(halves, inputs.a, inputs.b, inputs.scales, kIterations));
  const float* b_scales = inputs.scales.data() + kernels::kWgmmaProbeScaleSteps * 4;
  for (size_t e = 0; e < raw.size(); ++e) {
    const int r = static_cast<int>(e % 128), s = r / 64, half = (r % 64 / 2) % 2;
    double factor = 0;
    for (int step = 0; step < kIterations; ++step)
      factor += static_cast<double>(inputs.scales[(step % 16) * 4 + 2 * s + half] * b_scales[step % 16]);
    ASSERT_NEAR(scaled[e], raw[e] * factor, 1e-12 * std::fabs(raw[e] * factor) + 1e-300) << e;
  }
}

TEST(WgmmaProbeReference, RandomInputsAreNonZeroFp8AndSeeded) {
  const kernels::WgmmaProbeInputs one = kernels::wgmma_probe_random_inputs(3), two = kernels::wgmma_probe_random_inputs(3);
  EXPECT_EQ(one.a, two.a);
  EXPECT_NE(one.a, kernels::wgmma_probe_random_inputs(4).a);
  for (uint8_t code : one.a) {
    const float value = formats::e4m3_to_f32(code);
    ASSERT_TRUE(std::isfinite(value));
    ASSERT_GE(std::fabs(value), 0.25f);
    ASSERT_LE(std::fabs(value), 3.75f);
  }
  for (float scale : one.scales) ASSERT_GT(scale, 0.0f);
  EXPECT_THROW(kernels::wgmma_probe_reference({kernels::WgmmaProbePattern::kThroughput, 1, 2}, one.a, one.b,
                                              one.scales, 0),
               Error);
  EXPECT_THROW(kernels::wgmma_probe_reference({kernels::WgmmaProbePattern::kThroughput, 1, 2},
                                              std::vector<uint8_t>(5), one.b, one.scales, 1),
               Error);
}

TEST(WgmmaProbeReference, ConfigTableIsConsistent) {
  std::set<std::string> labels;
  for (const kernels::WgmmaProbeConfig& config : kernels::wgmma_probe_configs()) {
    EXPECT_TRUE(labels.insert(kernels::wgmma_probe_label(config)).second) << kernels::wgmma_probe_label(config);
    EXPECT_GE(config.warpgroups, 1);
    EXPECT_LE(config.warpgroups, 3);
    // operand rows of the last warpgroup's last sub-tile stay inside A
    EXPECT_LE(config.warpgroups * config.sub_tiles * 64, kernels::kWgmmaProbeARows);
    const auto shape = kernels::wgmma_probe_shape(config);
    EXPECT_EQ(shape.wgmma_per_group, 4);
    EXPECT_GT(shape.macs_per_group, 0);
  }
  EXPECT_EQ(labels.size(), kernels::wgmma_probe_configs().size());
}

}  // namespace
}  // namespace megamoe

// wgmma issue-pattern probe (src/kernels/wgmma_probe.h, `megamoe bench wgmma`): every compiled
// configuration's final fragments against the fp64 reference of the wgmma accumulator layout, on
// random non-zero E4M3 operands, and the checksums the bench relies on (bit-identical across repeats
// and CTAs, equal to the fragment sum). `--gtest_filter=*WgmmaProbe*` selects these tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/gpu_skip.h"
#include "gpu/fp8_test_util.h"
#include "kernels/wgmma_probe.h"
#include "megamoe/error.h"

namespace megamoe {
namespace {

using testing::DeviceBuffer;

// 19 steps: the scale table (16 rows) wraps, and the accumulators see 19 * 128 K.
constexpr int kIterations = 19;
constexpr int kCtas = 3;
constexpr uint64_t kSeed = 4242;

TEST(WgmmaProbe, FragmentsMatchReferenceAndChecksumsRepeat) {
  MEGAMOE_REQUIRE_GPUS(1);
  const kernels::WgmmaProbeInputs inputs = kernels::wgmma_probe_random_inputs(kSeed);
  const DeviceBuffer a(inputs.a), b(inputs.b), scales(inputs.scales);
  for (const kernels::WgmmaProbeConfig& config : kernels::wgmma_probe_configs()) {
    const std::string label = kernels::wgmma_probe_label(config) + " (seed " + std::to_string(kSeed) + ")";
    const kernels::WgmmaProbeShape shape = kernels::wgmma_probe_shape(config);
    const size_t threads_per_cta = static_cast<size_t>(config.warpgroups) * 128;
    const size_t per_cta = threads_per_cta * shape.fragment_registers;
    const std::vector<double> reference =
        kernels::wgmma_probe_reference(config, inputs.a, inputs.b, inputs.scales, kIterations);
    ASSERT_EQ(reference.size(), per_cta) << label;
    DeviceBuffer cycles(kCtas * threads_per_cta / 128 * 2 * sizeof(long long));
    DeviceBuffer checksums(kCtas * threads_per_cta * sizeof(float));
    DeviceBuffer fragments(kCtas * per_cta * sizeof(float));
    std::vector<float> first_checksums;
    for (int repeat = 0; repeat < 2; ++repeat) {
      MEGAMOE_CUDA_CHECK(cudaMemset(fragments.data, 0xFF, fragments.bytes));  // NaN poison
      MEGAMOE_CUDA_CHECK(cudaMemset(checksums.data, 0xFF, checksums.bytes));
      kernels::launch_wgmma_probe(config, a.as<uint8_t>(), b.as<uint8_t>(), scales.as<float>(), kIterations, kCtas,
                                  cycles.as<long long>(), checksums.as<float>(), fragments.as<float>(), nullptr);
      MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = fragments.download<float>();
      const std::vector<float> sums = checksums.download<float>();
      const std::vector<long long> clocks = cycles.download<long long>();
      // CTA 0 against the reference: rel-L2 and an elementwise bound. FP8 wgmma keeps ~14 bits of the
      // running sum: C and E promote every group (4 k32 in the tensor core) into FP32, the other
      // patterns accumulate all 19 x 4 (D: 19 x 8) k32 chunks in the tensor core, up to ~2e-3 of
      // the magnitude if the truncation is one-sided. A layout or descriptor error is O(1).
      const bool promoted = config.pattern == kernels::WgmmaProbePattern::kPromote ||
                            config.pattern == kernels::WgmmaProbePattern::kOverlapHalves;
      const double rel_l2_bound = promoted ? 2e-3 : 1e-2, element_bound = promoted ? 5e-3 : 2e-2;
      double error2 = 0, reference2 = 0;
      for (size_t i = 0; i < per_cta; ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << label << " element " << i;
        error2 += (got[i] - reference[i]) * (got[i] - reference[i]);
        reference2 += reference[i] * reference[i];
      }
      const double rms = std::sqrt(reference2 / per_cta);
      ASSERT_GT(rms, 0.0) << label;
      EXPECT_LT(std::sqrt(error2 / reference2), rel_l2_bound) << label;
      if (repeat == 0) std::printf("%-12s rel-L2 %.3g\n", kernels::wgmma_probe_label(config).c_str(), std::sqrt(error2 / reference2));
      for (size_t i = 0; i < per_cta; ++i)
        ASSERT_LE(std::fabs(got[i] - reference[i]), element_bound * (std::fabs(reference[i]) + rms))
            << label << " thread " << i / shape.fragment_registers << " register " << i % shape.fragment_registers
            << ": " << got[i] << " vs " << reference[i];
      // every CTA computes the same; checksum = the thread's fragment sum in register order
      for (int cta = 1; cta < kCtas; ++cta)
        ASSERT_EQ(0, std::memcmp(got.data(), got.data() + cta * per_cta, per_cta * sizeof(float))) << label << " CTA " << cta;
      for (size_t t = 0; t < kCtas * threads_per_cta; ++t) {
        float sum = 0.0f;
        for (int r = 0; r < shape.fragment_registers; ++r) sum += got[t * shape.fragment_registers + r];
        ASSERT_EQ(0, std::memcmp(&sum, &sums[t], sizeof(float))) << label << " thread " << t << ": " << sums[t];
      }
      for (size_t w = 0; w < clocks.size() / 2; ++w) ASSERT_GT(clocks[2 * w + 1], clocks[2 * w]) << label;
      if (repeat == 0) first_checksums = sums;
      else
        ASSERT_EQ(0, std::memcmp(first_checksums.data(), sums.data(), sums.size() * sizeof(float))) << label;
    }
  }
}

TEST(WgmmaProbe, RejectsBadArguments) {
  MEGAMOE_REQUIRE_GPUS(1);
  const kernels::WgmmaProbeInputs inputs = kernels::wgmma_probe_random_inputs(kSeed);
  const DeviceBuffer a(inputs.a), b(inputs.b), scales(inputs.scales), cycles(2 * 3 * 2 * sizeof(long long)),
      checksums(2 * 384 * sizeof(float));
  const kernels::WgmmaProbeConfig good{kernels::WgmmaProbePattern::kPromote, 2, 2};
  const auto launch = [&](kernels::WgmmaProbeConfig config, int iterations, int ctas) {
    kernels::launch_wgmma_probe(config, a.as<uint8_t>(), b.as<uint8_t>(), scales.as<float>(), iterations, ctas,
                                cycles.as<long long>(), checksums.as<float>(), nullptr, nullptr);
  };
  EXPECT_THROW(launch({kernels::WgmmaProbePattern::kPromote, 3, 2}, 1, 1), Error);  // not compiled: registers
  EXPECT_THROW(launch(good, 0, 1), Error);
  EXPECT_THROW(launch(good, 1, 0), Error);
  launch(good, 1, 2);
  MEGAMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace megamoe

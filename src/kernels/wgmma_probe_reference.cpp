// Host side of the wgmma probe (wgmma_probe.h): pattern names and shapes, and the fp64 reference of the
// final fragments, from the wgmma accumulator layout (not from the kernel's code).
#include <algorithm>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kernels/wgmma_probe.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe::kernels {

const char* wgmma_probe_pattern_name(WgmmaProbePattern pattern) {
  switch (pattern) {
    case WgmmaProbePattern::kThroughput: return "A";
    case WgmmaProbePattern::kLatency: return "B";
    case WgmmaProbePattern::kPromote: return "C";
    case WgmmaProbePattern::kWaitOnly: return "D";
    case WgmmaProbePattern::kOverlapHalves: return "E";
    case WgmmaProbePattern::kThroughputN256: return "F-A";
    case WgmmaProbePattern::kLatencyN256: return "F-B";
  }
  return "?";
}

const char* wgmma_probe_pattern_description(WgmmaProbePattern pattern) {
  switch (pattern) {
    case WgmmaProbePattern::kThroughput: return "4x m64n128k32 per group, wait_group 1, no promotion";
    case WgmmaProbePattern::kLatency: return "4x m64n128k32, wait_group 0, repeat";
    case WgmmaProbePattern::kPromote: return "per sub-tile: 4x m64n128k32, wait 0, 64 FFMA (our mainloop)";
    case WgmmaProbePattern::kWaitOnly: return "C without the FFMA promotion";
    case WgmmaProbePattern::kOverlapHalves: return "4x m64n64k32 per group, 2 partials, wait_group 1 + promotion";
    case WgmmaProbePattern::kThroughputN256: return "4x m64n256k32 per group, wait_group 1";
    case WgmmaProbePattern::kLatencyN256: return "4x m64n256k32, wait_group 0";
  }
  return "?";
}

WgmmaProbeShape wgmma_probe_shape(const WgmmaProbeConfig& config) {
  constexpr int64_t kN128 = int64_t{4} * 64 * 128 * 32;
  const int s = config.sub_tiles;
  switch (config.pattern) {
    case WgmmaProbePattern::kThroughput: return {s, 4, kN128, 64 * s, "m64n128k32"};
    case WgmmaProbePattern::kLatency: return {1, 4, kN128, 64, "m64n128k32"};
    case WgmmaProbePattern::kPromote: return {s, 4, kN128, 64 * s, "m64n128k32"};
    case WgmmaProbePattern::kWaitOnly: return {s, 4, kN128, 64, "m64n128k32"};
    case WgmmaProbePattern::kOverlapHalves: return {2 * s, 4, kN128 / 2, 64 * s, "m64n64k32"};
    case WgmmaProbePattern::kThroughputN256:
    case WgmmaProbePattern::kLatencyN256: return {1, 4, 2 * kN128, 128, "m64n256k32"};
  }
  MEGAMOE_FAIL("unknown wgmma probe pattern ", static_cast<int>(config.pattern));
}

const std::vector<WgmmaProbeConfig>& wgmma_probe_configs() {
  static const std::vector<WgmmaProbeConfig> configs(std::begin(kWgmmaProbeConfigs), std::end(kWgmmaProbeConfigs));
  return configs;
}

std::string wgmma_probe_label(const WgmmaProbeConfig& config) {
  return std::string(wgmma_probe_pattern_name(config.pattern)) + " wg" + std::to_string(config.warpgroups) + " s" +
         std::to_string(config.sub_tiles);
}

WgmmaProbeInputs wgmma_probe_random_inputs(uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Non-zero E4M3 in [0.25, 3.75] with random sign (exponent field 5..8, any mantissa): no zeros, no
  // NaN, products exact in fp64 and the 128-term sums far from FP32 overflow.
  std::uniform_int_distribution<int> exponent(5, 8), mantissa(0, 7), sign(0, 1);
  const auto draw = [&] {
    return static_cast<uint8_t>((sign(rng) << 7) | (exponent(rng) << 3) | mantissa(rng));
  };
  WgmmaProbeInputs inputs;
  inputs.a.resize(size_t{kWgmmaProbeARows} * kWgmmaProbeKBytes);
  inputs.b.resize(size_t{kWgmmaProbeBRows} * kWgmmaProbeKBytes);
  std::generate(inputs.a.begin(), inputs.a.end(), draw);
  std::generate(inputs.b.begin(), inputs.b.end(), draw);
  std::uniform_real_distribution<float> scale(0.5f / 16, 1.0f / 16);
  inputs.scales.resize(kWgmmaProbeScaleFloats);
  std::generate(inputs.scales.begin(), inputs.scales.end(), [&] { return scale(rng); });
  return inputs;
}

std::vector<double> wgmma_probe_reference(const WgmmaProbeConfig& config, const std::vector<uint8_t>& a,
                                          const std::vector<uint8_t>& b, const std::vector<float>& scales,
                                          int iterations) {
  MEGAMOE_CHECK(a.size() == size_t{kWgmmaProbeARows} * kWgmmaProbeKBytes, "a must hold ",
                kWgmmaProbeARows * kWgmmaProbeKBytes, " bytes, got ", a.size());
  MEGAMOE_CHECK(b.size() == size_t{kWgmmaProbeBRows} * kWgmmaProbeKBytes, "b must hold ",
                kWgmmaProbeBRows * kWgmmaProbeKBytes, " bytes, got ", b.size());
  MEGAMOE_CHECK(scales.size() == size_t{kWgmmaProbeScaleFloats}, "scales must hold ", kWgmmaProbeScaleFloats,
                " floats, got ", scales.size());
  MEGAMOE_CHECK(iterations >= 1, "iterations must be >= 1, got ", iterations);
  const WgmmaProbeShape shape = wgmma_probe_shape(config);
  const int s_count = config.sub_tiles;
  // product[a_row][b_row] over the 128-K block, exact in fp64
  std::vector<double> a_values(a.size()), b_values(b.size());
  std::transform(a.begin(), a.end(), a_values.begin(), [](uint8_t v) { return formats::e4m3_to_f32(v); });
  std::transform(b.begin(), b.end(), b_values.begin(), [](uint8_t v) { return formats::e4m3_to_f32(v); });
  std::vector<double> products(size_t{kWgmmaProbeARows} * kWgmmaProbeBRows);
  for (int i = 0; i < kWgmmaProbeARows; ++i)
    for (int j = 0; j < kWgmmaProbeBRows; ++j) {
      double sum = 0.0;
      for (int k = 0; k < kWgmmaProbeKBytes; ++k)
        sum += a_values[i * kWgmmaProbeKBytes + k] * b_values[j * kWgmmaProbeKBytes + k];
      products[static_cast<size_t>(i) * kWgmmaProbeBRows + j] = sum;
    }
  const auto product = [&](int a_row, int b_row) { return products[static_cast<size_t>(a_row) * kWgmmaProbeBRows + b_row]; };
  // sum over steps of a_scale(step, s, half) * b_scale(step), in float like the kernel's scale product
  const auto scale_sum = [&](int s, int half) {
    double sum = 0.0;
    for (int step = 0; step < iterations; ++step) {
      const int row = step % kWgmmaProbeScaleSteps;
      sum += static_cast<double>(scales[row * 4 + 2 * s + half] * scales[kWgmmaProbeScaleSteps * 4 + row]);
    }
    return sum;
  };
  const int registers = shape.fragment_registers;
  std::vector<double> out(static_cast<size_t>(config.warpgroups) * 128 * registers);
  for (int w = 0; w < config.warpgroups; ++w)
    for (int t = 0; t < 128; ++t)
      for (int r = 0; r < registers; ++r) {
        // wgmma FP32 accumulator layout: register i of thread t holds row 16 * warp + lane / 4 (+ 8 for
        // i % 4 >= 2), column 8 * (i / 4) + 2 * (lane % 4) + i % 2; sub-tile fragments are concatenated.
        const int s = (config.pattern == WgmmaProbePattern::kThroughputN256 ||
                       config.pattern == WgmmaProbePattern::kLatencyN256)
                          ? 0
                          : r / 64;
        const int i = (config.pattern == WgmmaProbePattern::kThroughputN256 ||
                       config.pattern == WgmmaProbePattern::kLatencyN256)
                          ? r
                          : r % 64;
        const int warp = t / 32, lane = t % 32, half = (i / 2) % 2;
        const int row = 16 * warp + lane / 4 + 8 * half;
        const int column = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        const int a_base = (w * s_count) * 64 + row;  // + 64 * sub-tile
        double value = 0.0;
        switch (config.pattern) {
          case WgmmaProbePattern::kThroughput:
          case WgmmaProbePattern::kLatency:
          case WgmmaProbePattern::kThroughputN256:
          case WgmmaProbePattern::kLatencyN256: value = iterations * product(a_base + 64 * s, column); break;
          case WgmmaProbePattern::kPromote:
          case WgmmaProbePattern::kOverlapHalves:
            value = product(a_base + 64 * s, column) * scale_sum(s, half);
            break;
          case WgmmaProbePattern::kWaitOnly:
            for (int sub = 0; sub < s_count; ++sub) value += iterations * product(a_base + 64 * sub, column);
            break;
        }
        out[(static_cast<size_t>(w) * 128 + t) * registers + r] = value;
      }
  return out;
}

}  // namespace megamoe::kernels

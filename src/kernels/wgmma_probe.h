// wgmma issue-pattern probe (issue #3): how busy the tensor pipe stays for the wgmma / wait / promotion
// patterns of the FP8-block grouped GEMM's mainloop, on synthetic shared-memory operands (no TMA, no
// global traffic in the timed loop). Kernel: sm90_wgmma_probe.cuh; launcher: wgmma_probe.cu; CPU
// reference of the final fragments: wgmma_probe_reference.cpp; driver: `megamoe bench wgmma`.
//
// Every CTA (one per SM, persistent) holds the same operands in shared memory, 128-byte swizzled
// K-major like the GEMM's TMA tiles: A = kWgmmaProbeARows x 128 E4M3, B = kWgmmaProbeBRows x 128
// E4M3 (one 128-K block), plus a scale table. Warpgroup w, sub-tile s reads A rows
// [(w * sub_tiles + s) * 64, +64) and B rows [0, 128) (n128), [0, 256) (n256) or the halves [0, 64),
// [64, 128) (n64). One "step" of a warpgroup = the groups of one 128-K block (see WgmmaProbePattern).
//
// Buffers (device, raw pointers):
//   a          uint8 [kWgmmaProbeARows][128]   E4M3, row-major (the kernel swizzles it into shared memory)
//   b          uint8 [kWgmmaProbeBRows][128]
//   scales     float [kWgmmaProbeScaleFloats]  a_scale[16 steps][2 sub-tiles][2 row halves], then b_scale[16]
//   cycles     int64 [ctas][warpgroups][2]     clock64 at loop start / end of every warpgroup
//   checksums  float [ctas][warpgroups * 128]  sum of each thread's final fragment registers
//   fragments  float [ctas][warpgroups][128][fragment_registers] (optional, nullptr = not written)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#ifdef MEGAMOE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace megamoe::kernels {

constexpr int kWgmmaProbeARows = 3 * 2 * 64;  // 3 warpgroups x 2 sub-tiles x 64 rows
constexpr int kWgmmaProbeBRows = 256;
constexpr int kWgmmaProbeKBytes = 128;        // one 128-K block of E4M3 = one 128-byte swizzle row
constexpr int kWgmmaProbeScaleSteps = 16;     // step i uses scale row i % 16
constexpr int kWgmmaProbeScaleFloats = kWgmmaProbeScaleSteps * 4 + kWgmmaProbeScaleSteps;

// Per warpgroup and step (S = sub_tiles):
enum class WgmmaProbePattern : int {
  kThroughput,      // A: S groups of 4 x m64n128k32 into S accumulators, wait_group 1 after each (1 queued)
  kLatency,         // B: 1 group of 4 x m64n128k32, wait_group 0
  kPromote,         // C: S x (4 x m64n128k32 into the partial, wait 0, 64 FFMA acc[s] += partial * scale)
  kWaitOnly,        // D: C without the promotion (wait 0 only; the groups accumulate into one partial)
  kOverlapHalves,   // E: 2S groups of 4 x m64n64k32 into two 32-register partials, wait_group 1, the
                    //    promotion of group g-1 after issuing group g (fp8_tile_mainloop_half_overlap)
  kThroughputN256,  // F/A: 1 group of 4 x m64n256k32, wait_group 1
  kLatencyN256,     // F/B: 1 group of 4 x m64n256k32, wait_group 0
};

struct WgmmaProbeConfig {
  WgmmaProbePattern pattern;
  int warpgroups;  // math warpgroups per CTA (1..3), no producer warpgroup
  int sub_tiles;   // 64-row sub-tiles per warpgroup (1 or 2)
};

struct WgmmaProbeShape {
  int groups_per_step;
  int wgmma_per_group;
  int64_t macs_per_group;
  int fragment_registers;  // registers per thread written to `fragments`
  const char* instruction; // "m64n128k32"
};

// The compiled configurations, in table order. 3 warpgroups get 168 registers per thread: C and E run
// one sub-tile there (2 x 64 accumulators + a 64-register partial do not fit).
inline constexpr WgmmaProbeConfig kWgmmaProbeConfigs[] = {
    {WgmmaProbePattern::kThroughput, 1, 2},      {WgmmaProbePattern::kThroughput, 2, 2},
    {WgmmaProbePattern::kThroughput, 3, 2},      {WgmmaProbePattern::kLatency, 1, 1},
    {WgmmaProbePattern::kLatency, 2, 1},         {WgmmaProbePattern::kLatency, 3, 1},
    {WgmmaProbePattern::kPromote, 1, 2},         {WgmmaProbePattern::kPromote, 2, 2},
    {WgmmaProbePattern::kPromote, 2, 1},         {WgmmaProbePattern::kPromote, 3, 1},
    {WgmmaProbePattern::kWaitOnly, 1, 2},        {WgmmaProbePattern::kWaitOnly, 2, 2},
    {WgmmaProbePattern::kWaitOnly, 3, 2},        {WgmmaProbePattern::kOverlapHalves, 1, 2},
    {WgmmaProbePattern::kOverlapHalves, 2, 2},   {WgmmaProbePattern::kOverlapHalves, 3, 1},
    {WgmmaProbePattern::kThroughputN256, 1, 1},  {WgmmaProbePattern::kThroughputN256, 2, 1},
    {WgmmaProbePattern::kThroughputN256, 3, 1},  {WgmmaProbePattern::kLatencyN256, 1, 1},
    {WgmmaProbePattern::kLatencyN256, 2, 1},     {WgmmaProbePattern::kLatencyN256, 3, 1},
};
constexpr int kWgmmaProbeSharedBytes =
    1024 + (kWgmmaProbeARows + kWgmmaProbeBRows) * kWgmmaProbeKBytes + kWgmmaProbeScaleFloats * 4;

const char* wgmma_probe_pattern_name(WgmmaProbePattern pattern);  // "A", "B", ..., "F-A", "F-B"
const char* wgmma_probe_pattern_description(WgmmaProbePattern pattern);
WgmmaProbeShape wgmma_probe_shape(const WgmmaProbeConfig& config);
const std::vector<WgmmaProbeConfig>& wgmma_probe_configs();  // kWgmmaProbeConfigs
std::string wgmma_probe_label(const WgmmaProbeConfig& config);  // "C wg2 s2"

struct WgmmaProbeInputs {
  std::vector<uint8_t> a, b;  // E4M3 bytes, [kWgmmaProbeARows | kWgmmaProbeBRows][128]
  std::vector<float> scales;  // kWgmmaProbeScaleFloats
};
// Seeded random non-zero E4M3 operands (|x| in [0.25, 3.75]) and scales in [1/32, 1/16).
WgmmaProbeInputs wgmma_probe_random_inputs(uint64_t seed);

// fp64 reference of fragments[cta][w][t][*] (identical for every CTA) after `iterations` steps, from the
// host copies of a, b (E4M3 bytes) and scales. Layout as `fragments` of one CTA.
std::vector<double> wgmma_probe_reference(const WgmmaProbeConfig& config, const std::vector<uint8_t>& a,
                                          const std::vector<uint8_t>& b, const std::vector<float>& scales,
                                          int iterations);

#ifdef MEGAMOE_WITH_CUDA
// Launches `ctas` CTAs of config.warpgroups * 128 threads; each warpgroup runs `iterations` steps.
// Validates the config (must be in wgmma_probe_configs()), iterations >= 1, ctas >= 1 and the pointers.
void launch_wgmma_probe(const WgmmaProbeConfig& config, const uint8_t* a, const uint8_t* b, const float* scales,
                        int iterations, int ctas, long long* cycles, float* checksums, float* fragments,
                        cudaStream_t stream);
#endif

}  // namespace megamoe::kernels

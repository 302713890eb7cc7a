// `megamoe bench wgmma`: the wgmma issue-pattern probe (src/kernels/wgmma_probe.h, issue #3) on every
// compiled configuration; prints pattern, warpgroups, TFLOP/s, tensor utilisation and cycles per group.
#pragma once

#include <cstdint>
#include <string>

namespace megamoe::bench {

struct WgmmaBenchOptions {
  int iterations = 20000;  // steps per warpgroup per launch (~10 ms for pattern A)
  int repeats = 5;         // timed launches per configuration (median), after one warm-up launch
  int ctas = 0;            // 0 = one per SM
  uint64_t seed = 20261130;
  double ceiling_tflops = 1420.0;  // measured FP8 GEMM ceiling (docs/perf.md), for the second utilisation
  std::string json_path;           // empty: no JSON file
};

// Returns the process exit code (1 when a checksum is not finite or differs between repeats).
int run_wgmma_bench(const WgmmaBenchOptions& options);

}  // namespace megamoe::bench

// `megamoe bench gemm`: grouped FP8-block (or, with format "bf16", BF16) expert GEMMs vs cuBLASLt dense
// FP8 / cuBLAS BF16 on the same FLOPs.
#pragma once

#include <string>
#include <vector>

namespace megamoe::bench {

struct GemmBenchOptions {
  std::vector<std::string> models{"dsv3", "ml3", "ms4", "dsv4-flash", "qwen3-30b"};
  std::vector<int> rows_per_expert{8, 32, 128, 512, 1024, 2048, 4096};
  int experts = 32;
  std::vector<int> gemms{1, 2};  // which GEMMs to time: 1 (gate/up), 2 (down)
  int repeats = 20;
  // "fp8": FP8-block kernels vs cuBLASLt FP8; "nvfp4" / "mxfp4": W4A8 kernels vs cuBLASLt FP8 (no BF16
  // baseline); "bf16": BF16 kernels vs cuBLAS BF16
  std::string format = "fp8";
  std::string json_path;  // empty: no JSON file
  int rows_hint = 0;            // tile-choice hint passed to the kernels (0 = the actual rows per expert)
  bool skip_cublas = false;     // skip the cuBLAS denominators (A/B runs of one kernel knob)
  // FP8-block math-warpgroup schedule (docs/grouped_gemm.md, v5): --schedule "auto" (heuristic / env), "serial"
  // (v4), "pingpong", "overlap" (v5), or "all": serial, then pingpong and overlap timed right after it
  // per point (A/B in one run; the main columns are serial).
  std::string schedule = "auto";
  // FP8 GEMM 1 kernel (docs/grouped_gemm.md "v9"): "off" = split-N tiles (weights packed kGateUp), "on" = v9
  // (kGateUpInterleaved8), "both" = off in the main columns and v9 timed right after it per point (a row
  // "v9"; the random weight bytes are read as either layout: the timing does not depend on their order).
  std::string gemm1_v9 = "off";
  // v9 skews (GroupedGemm1Fp8Args::v9_skew_kblocks) timed per point with --gemm1-v9 both (rows "v9" for 0,
  // "v9_skewN" otherwise); --gemm1-v9 on: the first is the main column.
  std::vector<int> v9_skews{0};
  // v11 GEMM 1 (docs/grouped_gemm.md "v11 GEMM 1", GroupedGemm1Fp8Args::v11; kGateUpInterleaved8 weights): "off",
  // "on" (the main column; needs --gemm1-v9 on), "both" = the main column as --gemm1-v9 says and v11 timed right
  // after it (and after the v9 rows) per point (a row "v11", serial, interleaved weights).
  std::string gemm1_v11 = "off";
  // v11 GEMM 1 small (docs/grouped_gemm.md "v11 GEMM 1 small", GroupedGemm1Fp8Args::v11_small: the 64 x 256 tile whose
  // math warpgroups split N): "off" (every v11 run on the 128 x 256 tile), "on" (the v11 runs use the small tile),
  // "both" = v11 small timed right after the v11 row per point (a row "v11_small"; needs --gemm1-v11 on or both).
  std::string gemm1_v11_small = "off";
  // Rows per expert: "none" = every expert exactly `rows`; "multinomial" = rows x experts rows routed one by one to
  // a uniformly drawn expert (the layer's uniform routing: a spread of ~sqrt(rows)), std::mt19937_64(spread_seed),
  // the same counts for every kernel of a point (printed: min / max, experts ending in a tile of <= 64 rows).
  std::string rows_spread = "none";
  uint64_t spread_seed = 2026;
  // BF16 kernels (docs/grouped_gemm.md "BF16 v2"), --format bf16 only: "auto" = the library default
  // (MEGAMOE_BF16_GEMM_V2 / heuristic; GEMM 1 packed as the staged backend would), "off" = v1 (GEMM 1 split-N
  // on kGateUp weights, GEMM 2 v1 tiles), "on" = v2 (GEMM 1 wide on kGateUpInterleaved8, GEMM 2 v2), "both" =
  // off in the main columns and v2 timed right after it per point (a row "v2" with the speed-up).
  std::string bf16_v2 = "auto";
  // FP8 GEMM 2 v11 (docs/grouped_gemm.md "v11", GroupedGemm2Fp8Args::v11): "auto" = MEGAMOE_FP8_GEMM_V11 (default
  // off), "off" / "on" in the main columns, "both" = off in the main columns and v11 timed right after it per
  // point (a row "v11"; JSON v11_us / v11_tflops). v11_bn: its tile width (128 / 192; 0 = MEGAMOE_FP8_GEMM_V11_BN,
  // else 192).
  std::string fp8_v11 = "auto";
  int v11_bn = 0;
  // FP8 GEMM 1 in two passes (kernels/swiglu_quant.h), --format fp8 only: "off", or "both" = the fused kernel in
  // the main columns and, timed right after it per point, rows "two_pass" (plain grouped GEMM n = 2I into BF16 +
  // swiglu_quant_fp8, one timed span), "two_pass_gemm" (the plain GEMM alone) and "two_pass_swiglu" (pass 2 alone;
  // also its HBM GB/s: BF16 in, E4M3 + scales out).
  std::string gemm1_two_pass = "off";
};

// Prints a table to stdout (and JSON to options.json_path); returns the process exit code.
int run_gemm_bench(const GemmBenchOptions& options);

}  // namespace megamoe::bench

// Tile shapes and pipeline depth of the sm_90a grouped GEMMs, and how one is chosen.
//
// Every CTA runs 3 warpgroups: 1 producer (one thread issues TMA) + 2 math warpgroups. A math
// warpgroup owns 1 or 2 sub-tiles of 64 x 128 (wgmma m64n128k32; FP32 registers: 64 for the 128-K
// partial + 64 per sub-tile for the promoted sum). The two math warpgroups are arranged either
//   split-M: they split the tile's rows (both read the same B tile), or
//   split-N: they split its 256 columns (both read the same A tile). GEMM 1 is always split-N:
//            warpgroup 0 = 128 gate columns, warpgroup 1 = the 128 up columns of the same outputs, so
//            SwiGLU and the per-128 requantization finish inside one CTA.
// Pipeline stages fill the 227 KiB of shared memory: stage = (BLOCK_M + BLOCK_N) * 128 bytes.
// The grid is persistent: one CTA per SM, tiles (expert, m-tile, n-tile) strided by gridDim.x, with
// m-tiles of one expert consecutive and the n-tile fastest (CTAs running together share A rows).
#pragma once

namespace megamoe::kernels::sm90 {

constexpr int kBlockK = 128;                // one FP8 scale block of K per pipeline stage
constexpr int kMathWarpgroups = 2;
constexpr int kThreadsPerCta = 128 * (1 + kMathWarpgroups);
constexpr int kProducerRegisters = 40;
constexpr int kMathRegisters = 232;
constexpr int kMaxExperts = 1024;

struct TileConfig {
  int warpgroups_m;  // 2: split-M; 1: split-N
  int sub_tiles_m;   // 64-row wgmma sub-tiles per math warpgroup
  int stages;
  int groups_n = 1;  // 128-column wgmma groups per math warpgroup (2: GEMM 1 v9, gate/up interleaved by 8)
  constexpr int block_m() const { return 64 * sub_tiles_m * warpgroups_m; }
  constexpr int block_n() const { return 128 * groups_n * (kMathWarpgroups / warpgroups_m); }
};

// Small groups (<= 64 rows per expert): weight-stream bound, the smallest M tile wastes least.
constexpr TileConfig kSplitNSmall{1, 1, 4};   //  64 x 256, 40 KiB/stage
constexpr TileConfig kSplitNLarge{1, 2, 4};   // 128 x 256, 48 KiB/stage (+16 KiB SwiGLU exchange)
constexpr TileConfig kSplitMSmall{2, 1, 6};   // 128 x 128, 32 KiB/stage
constexpr TileConfig kSplitMLarge{2, 2, 4};   // 256 x 128, 48 KiB/stage
// GEMM 1 v9 (docs/grouped_gemm.md "v9"): split-M 128 x 256, each math warpgroup 64 rows x all 256
// columns as 2 groups of 128; needs the gate/up-interleaved-by-8 weight layout (GemmRole::kGateUpInterleaved8).
constexpr TileConfig kGateUpInterleaved{2, 1, 4, 2};  // 128 x 256, 48 KiB/stage (+18 KiB FP8 row staging)

// Large tiles raise the FLOPs per byte fetched from L2 (128x256: 85 FLOP/B vs 64x256: 51, 128x128: 64),
// which bounds these kernels at large M; they pay off once an expert fills most of a 128/256-row tile.
inline TileConfig choose_plain_tile(int rows_per_expert_hint) {
  if (rows_per_expert_hint > 0 && rows_per_expert_hint <= 64) return kSplitNSmall;
  if (rows_per_expert_hint > 0 && rows_per_expert_hint < 512) return kSplitMSmall;
  return kSplitMLarge;
}
// Fraction of the last wave's CTA slots that hold work, for `tiles` tiles on `ctas` persistent CTAs.
inline double wave_efficiency(long tiles, int ctas) {
  const long waves = (tiles + ctas - 1) / ctas;
  return waves == 0 ? 1.0 : static_cast<double>(tiles) / static_cast<double>(waves * ctas);
}

// GEMM 1 (n = 2I): 64 x 256 for small groups; 128 x 256 otherwise, unless it leaves the last wave
// mostly empty while 64 x 256 does not (measured: Qwen3-30B, 32 experts x 128 rows, 2I = 1536:
// 192 tiles on 132 SMs ran at 282 TFLOP/s with 128 x 256 vs 387 with 64 x 256; DeepSeek-V3 with
// 512 vs 1024 tiles preferred 128 x 256, 668 vs 551).
// small_rows_limit: hints up to this take the 64-row tile outright (64 for BF16 and W4A8, as measured before session
// 12; FP8 GEMM 1 passes kFp8Gemm1SmallRowsLimit).
inline TileConfig choose_gate_up_tile(int rows_per_expert_hint, int num_experts, int n, int ctas,
                                      int small_rows_limit = 64) {
  if (rows_per_expert_hint > 0 && rows_per_expert_hint <= small_rows_limit) return kSplitNSmall;
  if (rows_per_expert_hint <= 0) return kSplitNLarge;
  const long n_tiles = n / 256;
  const long large = static_cast<long>(num_experts) * ((rows_per_expert_hint + 127) / 128) * n_tiles;
  const long small = static_cast<long>(num_experts) * ((rows_per_expert_hint + 63) / 64) * n_tiles;
  return wave_efficiency(large, ctas) < 0.85 && wave_efficiency(small, ctas) > wave_efficiency(large, ctas)
             ? kSplitNSmall
             : kSplitNLarge;
}

// FP8 GEMM 1 (split-N): the 64-row tile only up to a MEAN of 56 rows per expert.
// NOTES: the hint is a mean (T x top_k / experts). With uniform routing the rows per expert spread by about
// sqrt(mean); every expert above 64 rows takes two 64-row m-tiles (two reads of its weights), while the 128-row
// tile costs ~20% more than the 64-row one when an expert has <= 64 rows (bench gemm at exactly 48 / 64 rows: 321 /
// 301 vs 267 / 249 µs, dsv3). Measured crossover (docs/perf.md session 12 call 7, staged dsv3 on one rank, GEMM 1
// phase, 64-row vs 128-row tiles): mean 32 rows 1843 vs 2117 µs, 48: 1930 vs 2148, 56: 2048 vs 2115, 64: 2570 vs
// 2174. BF16 and W4A8 keep their measured limit of 64.
constexpr int kFp8Gemm1SmallRowsLimit = 56;

// How the two math warpgroups of the FP8-block kernel share the tensor cores (docs/grouped_gemm.md, v5).
//   kSerial:       v4. Both warpgroups issue their wgmma group as soon as the stage is full, so their
//                  groups interleave on the tensor cores, finish together, and both promote (CUDA
//                  cores) while the tensor cores idle.
//   kOrderedIssue: v5 ("pingpong"). The warpgroups take turns issuing (two named barriers pass an
//                  issue token), so the tensor cores run one warpgroup's group while the other
//                  promotes its previous one. Same registers and shared memory as kSerial.
//   kHalfOverlap:  v5 ("overlap"). Inside each warpgroup the next wgmma group is issued before the
//                  previous one is promoted (wgmma.wait_group 1), with groups of 64 x 64 (two
//                  32-register partials: the registers of one 64 x 128 partial). Costs a wgmma with half
//                  the N (more shared-memory operand traffic per FLOP), hides the promotion.
// The fused MegaMoE kernel keeps kSerial (it shares the device pieces; the template default).
enum class MathSchedule : int { kSerial = 0, kOrderedIssue = 1, kHalfOverlap = 2 };

// Measured (docs/perf.md "Session 4", same-run A/B): kOrderedIssue and kHalfOverlap gave no gain over
// kSerial at 1024-4096 rows, so kSerial stays the default; the env MEGAMOE_FP8_GEMM_SCHEDULE and the
// per-call args override it (grouped_gemm.cu).
inline MathSchedule choose_math_schedule(int /*rows_per_expert_hint*/) { return MathSchedule::kSerial; }

// GEMM 1 v9 is chosen by the weights, not here: grouped_gemm1_fp8 runs kGateUpInterleaved for every
// rows hint when the weights were packed with GemmRole::kGateUpInterleaved8 (a 64-row expert then
// runs one active warpgroup: active_sub_tiles skips the other's MMAs), and the split-N tiles above for
// GemmRole::kGateUp. Which packing the staged backend makes is its load-time choice:
// prefer_gate_up_interleaved8() below (MEGAMOE_FP8_GEMM1_V9=0/1 overrides it).
// Measured (session 8, H200, bench gemm at 1024 / 4096 rows per expert group, same run): v9 vs split-N
// dsv3 (K 7168) 0.978 / 0.976, ms4 (K 4096) 1.098 / 1.112, qwen3-30b (K 2048) 1.124 / 1.096.
// NOTES: v9 saves the split-N epilogue's gate/up exchange (a fixed cost per tile), so its gain shrinks
// as K (hidden) grows and the K loop dominates; at K 7168 the 128 x 256 split-M mainloop's extra
// shared-memory traffic outweighs it. Hence the cut at K <= 4096 (the measured crossover lies between
// 4096 and 7168).
// Session 13 (docs/perf.md "Session 13", calls 1-2): with v11 GEMM 1 on these weights (prefer_fp8_gemm1_v11 below)
// the interleaved packing wins at every hidden size from a mean of ~64 rows per expert up: staged dsv3 FP8 on 2 ranks,
// split-N vs v11, µs: 1024 tokens 1789-1817 vs 1627-1633, 2048 2528-2554 vs 2308-2346, 8192 7254-7297 vs 6669-6677;
// at 512 tokens equal (1541-1569 vs 1557-1564), at 128 tokens +3% (1437-1469 vs 1486-1490: the split-N 64-row tile
// is 4-5% faster at <= 32 rows per expert, bench gemm). ms4 and qwen3-30b (v9 before): 13-20% faster at 128-8192
// tokens. One packing for every rows hint (the choice is made at load time), so the interleaved one everywhere.
inline bool prefer_gate_up_interleaved8(int /*hidden*/) { return true; }

// v11 GEMM 1 (sm90_fp8_wide_gemm1.cuh) vs v9 on kGateUpInterleaved8 weights: bit-identical outputs; v11 measured
// 1.06-1.23x v9 at 512-4096 rows (bench gemm, 32 experts, session 13 call 1) and 1.2-1.5x at 8-128 rows (call 2:
// v9 runs both math warpgroups' promotion on a one-warpgroup tile; v11 skips the empty one). So v11 at every
// rows hint; MEGAMOE_FP8_GEMM1_V11=0 / GroupedGemm1Fp8Args::v11 = 0 keep v9.
inline bool prefer_fp8_gemm1_v11(int /*rows_per_expert_hint*/) { return true; }

// v11 clusters of 2 (docs/grouped_gemm.md "v11 clusters"; MEGAMOE_GEMM_CLUSTER=0|1 overrides both GEMMs). Measured
// (session 15 call H, one H200, bench gemm fp8, 128 experts, cluster 0 / 1 in alternating processes, two rounds, µs):
// GEMM 1 128 x 256 on dsv3 (K 7168) and ms4 (K 4096) 1.01-1.13x faster at multinomial means 256 / 512 / 1024 and exact
// 1024 / 4096 rows (dsv3 exact 1024: 1146 -> 1233 TFLOP/s); qwen3-30b (K 2048) 0.98-0.99x. GEMM 2 0.88-1.04x (mostly
// slower: its K-loop is short, and a cluster's two CTAs refill in lock step). So GEMM 1 from K >= 4096, GEMM 2 never.
inline bool prefer_fp8_gemm1_cluster(int k) { return k >= 4096; }
inline bool prefer_fp8_gemm2_cluster(int /*k*/) { return false; }

// v11 GEMM 1 small (sm90_fp8_wide_gemm1.cuh, docs/grouped_gemm.md "v11 GEMM 1 small"): the 64 x 256 tile whose two
// math warpgroups split N, on the same kGateUpInterleaved8 weights, for rows hints in (0, kFp8Gemm1SmallRowsLimit].
// Bit-identical to v11's 128 x 256 tile. Measured (session 13 call 4, bench gemm, 128 experts, exact rows, best of 2
// rounds, µs split-N 64-row / v11 / small): dsv3 8 rows 880 / 890 / 876, 32 rows 927 / 953 / 907, 64 rows 1130 / 972 /
// 930; ms4 8: 512 / 522 / 508, 64: 752 / 570 / 545; qwen3-30b 8: 111 / 118 / 109, 32: 124 / 136 / 120, 64: 216 / 138 /
// 123. Faster than both everywhere at 8-64 rows; staged dsv3 on one rank at 256 / 1024 tokens: -1.5% (layer).
// NOTES: the limit stays the split-N one (56, a mean): above it the spread leaves many experts with > 64 rows, which
// the 64-row tile reads twice; the crossover on this packing was not measured. MEGAMOE_FP8_GEMM1_V11_SMALL=0/1 and
// GroupedGemm1Fp8Args::v11_small override it.
constexpr bool kFp8Gemm1V11SmallDefault = true;
inline bool prefer_fp8_gemm1_v11_small(int rows_per_expert_hint) {
  return kFp8Gemm1V11SmallDefault && rows_per_expert_hint > 0 && rows_per_expert_hint <= kFp8Gemm1SmallRowsLimit;
}

// BF16 v2 (docs/grouped_gemm.md "BF16 v2"; sm90_bf16_grouped_gemm.cuh, sm90_bf16_wide_grouped_gemm_kernel):
// split-M 128 x 256 with one wgmma m64n256k16 per 16 K per math warpgroup, 4 stages, bulk-store epilogue
// with 32 staging rows. GEMM 2 / plain: every rows hint > 64 (and unknown) on n % 256 == 0; <= 64 rows
// keeps the 64 x 256 split-N tile (with the bulk-store epilogue). GEMM 1: chosen by the weights (like
// FP8 v9): GemmRole::kGateUpInterleaved8 runs the wide tile at every rows hint, kGateUp the split-N tiles.
constexpr TileConfig kBf16Wide{2, 1, 4, 2};  // 128 x 256, 48 KiB/stage (+17 KiB BF16 staging)
// Whether the BF16 v2 kernels are the default (grouped_gemm_bf16 / grouped_gemm2_bf16 with v2 = -1, and
// the staged backend's BF16 W13 packing); MEGAMOE_BF16_GEMM_V2=0/1 overrides it (grouped_gemm.h).
// NOTES: measured (docs/grouped_gemm.md "BF16 v2", session 10, v1 and v2 in one run, bit-identical):
// GEMM 2 +11% (dsv3) to +28% (qwen3-30b) at 1024-4096 rows; GEMM 1 -4% / +5% at dsv3 1024 / 4096 rows,
// +17-19% at qwen3-30b; -1..-3% at 32 rows (v2 GEMM 1 runs the 128-row tile there). Default: v2.
inline bool prefer_bf16_v2() { return true; }

// W4A8 (sm90_w4a8_grouped_gemm.cuh): always split-N, 256 columns; 64 or 128 rows chosen as for GEMM 1
// (the FP4 decode costs the same per weight byte for both, so the larger tile halves it per FLOP).
inline int choose_w4a8_sub_tiles(int rows_per_expert_hint, int num_experts, int n, int ctas) {
  return choose_gate_up_tile(rows_per_expert_hint, num_experts, n, ctas).sub_tiles_m;
}

// v11 (docs/grouped_gemm.md "v11", sm90_fp8_wide_grouped_gemm.cuh): a 128 x block_n tile starting at output
// column n0 (a multiple of block_n) multiplies its 8-column groups j < wide_former_groups(block_n, n0) by the B
// block scale of block n0 / 128 and the others by that of wide_second_block(n0, n) = the next block, clamped to
// the last one (the columns past n it would cover are never stored).
constexpr int wide_former_groups(int block_n, int n0) {
  return (128 - n0 % 128) / 8 < block_n / 8 ? (128 - n0 % 128) / 8 : block_n / 8;
}
constexpr int wide_second_block(int n0, int n) { return n0 / 128 + 1 < n / 128 ? n0 / 128 + 1 : n / 128 - 1; }

// Whether v11 is the default for a plain / GEMM-2 call (v11 = -1 with MEGAMOE_FP8_GEMM_V11 unset).
// NOTES: measured (docs/perf.md session 12, one H200, bit-identical outputs): v11 at 128 x 192 is 1.01-1.13x the
// v8-v10 kernels at 512-4096 rows per expert (dsv3, ms4, qwen3-30b), 1.02x at 128 rows, 0.94-0.98x at 8-64 rows
// when every expert has exactly that many; in the staged dsv3 layer at 2048 tokens (a mean of 64 rows per expert,
// uniform routing) it cut GEMM 2 from 1262 to 953 µs, because the old heuristic's 64-row tiles need two m-tiles (two
// weight reads) for every expert above 64 rows. Hence v11 from a mean of 33 rows up (and for an unknown hint).
// A B box of 192 rows needs num_experts x n >= 192 rows in the tensor map: smaller problems keep the old kernel.
inline bool prefer_fp8_v11(int rows_per_expert_hint, int num_experts, int n) {
  return (rows_per_expert_hint <= 0 || rows_per_expert_hint > 32) && static_cast<long>(num_experts) * n >= 192;
}

// v11 selection (GroupedGemm2Fp8Args::v11 / v11_block_n): v11 = 1 on, 0 off, -1 = env_v11 ("0" / "1"; unset
// or empty: `auto_on`, i.e. prefer_fp8_v11); block_n = 128 / 192, 0 = env_bn ("128" / "192"; unset or empty: 192).
// Returns the tile width, 0 when v11 is off, -1 when a value (argument or environment) is invalid. env_* may be
// null (unset).
inline int resolve_v11_block_n(int v11, int block_n, const char* env_v11, const char* env_bn, bool auto_on = false) {
  const auto is = [](const char* text, const char* what) {
    for (; *text && *what; ++text, ++what)
      if (*text != *what) return false;
    return *text == *what;
  };
  const bool env_v11_set = env_v11 != nullptr && *env_v11 != '\0';
  if (v11 < -1 || v11 > 1) return -1;
  if (v11 == -1 && env_v11_set && !is(env_v11, "0") && !is(env_v11, "1")) return -1;
  const bool on = v11 == -1 ? (env_v11_set ? is(env_v11, "1") : auto_on) : v11 == 1;
  if (!on) return 0;
  if (block_n == 0) {
    if (env_bn == nullptr || *env_bn == '\0') return 192;
    return is(env_bn, "128") ? 128 : is(env_bn, "192") ? 192 : -1;
  }
  return block_n == 128 || block_n == 192 ? block_n : -1;
}

}  // namespace megamoe::kernels::sm90

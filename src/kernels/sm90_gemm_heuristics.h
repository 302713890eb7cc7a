// Tile shapes and pipeline depth of the sm_90a grouped GEMMs, and how one is chosen.
//
// Every CTA runs 3 warpgroups: 1 producer (one thread issues TMA) + 2 math warpgroups. Each math
// warpgroup owns a 64 x 128 sub-tile (wgmma m64n128k32, FP32 accumulators: 64 registers for the
// 128-K partial + 64 for the promoted sum). The two math warpgroups are arranged either
//   split-M: tile 128 x 128 (both share the B tile; A reuse x2) — large groups, GEMM 2;
//   split-N: tile  64 x 256 (both share the A tile) — GEMM 1 always (warpgroup 0 = gate 128 columns,
//            warpgroup 1 = the up 128 columns of the same outputs, so SwiGLU + per-128 requant
//            finish inside one CTA), and GEMM 2 for small groups (<= 64 rows per expert, where a
//            128-row tile would be mostly padding and the kernel is weight-stream bound).
// Pipeline stages fill the 227 KiB of shared memory: stage = (BLOCK_M + BLOCK_N) * 128 bytes.
//   split-M: 32 KiB/stage x 6;  split-N: 40 KiB/stage x 4 (+32 KiB SwiGLU exchange buffer).
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
  int warpgroups_m;  // 2: split-M (128 x 128); 1: split-N (64 x 256)
  int stages;
  constexpr int block_m() const { return 64 * warpgroups_m; }
  constexpr int block_n() const { return 128 * (kMathWarpgroups / warpgroups_m); }
};

constexpr TileConfig kSplitM{2, 6};
constexpr TileConfig kSplitN{1, 4};

// GEMM 2 / plain GEMM: rows_per_expert_hint is the expected rows per expert (0 = unknown -> split-M).
inline TileConfig choose_plain_tile(int rows_per_expert_hint) {
  return (rows_per_expert_hint > 0 && rows_per_expert_hint <= 64) ? kSplitN : kSplitM;
}

}  // namespace megamoe::kernels::sm90

// v11 GEMM 1: v11's structure (sm90_fp8_wide_grouped_gemm.cuh: warp-uniform control flow and descriptors,
// optional TMA A scales) on v9's problem (docs/grouped_gemm.md "v9", "v11 GEMM 1"): split-M 128 x 256 tiles
// on W13 packed gate/up-interleaved by 8 (GemmRole::kGateUpInterleaved8), SwiGLU + FP8 requant epilogue
// (swiglu_quant_fp8_rows_epilogue, reused; in its kTmaStore form: TMA tensor stores of whole 16-row warps).
//
// Per element the arithmetic of v9 (fp8_kblock_groups with Layout::kGroupsN = 2): per k-block and math
// warpgroup two groups h = 0, 1 (the tile's two 128-column n-halves), each 4 wgmma m64n128k32 into the ONE
// 64-register partial, wait 0, then accumulator[h][4j + 2r + c] += partial[4j + 2r + c] * (scale_a[r] *
// scale_b[j % 2]) with scale_b[0] = the tile's gate block scale, scale_b[1] = its up block scale (the
// interleave puts gate columns at even 8-column groups j, up at odd: grouped_gemm.h); the stage is released
// after group 1's wait. Same partials, same FFMA order, same epilogue: codes and scales bit-identical to v9
// (and so to the split-N kernel).
//
// CTA = 3 warpgroups, 384 threads, persistent:
// - warpgroup 0: thread 0 streams A (two 64-row boxes trimmed to the expert) and B (one 256-row box) per
//   stage (produce_fp8_tile_trimmed, or wide_produce_tile_tma_scales with the A-scale boxes); warp 1 stages
//   the A scales (cp.async path) and the tile's gate / up block scales (produce_fp8_scales /
//   wide_produce_b_scales: [kBScaleIndex] = gate block 2 n_tile, [kBScaleIndex + 1] = up block 2 n_tile + 1).
// - warpgroups 1, 2: tile rows [64 w, 64 w + 64), all 256 packed columns; the k loop below, then
//   swiglu_quant_fp8_rows_epilogue (128 outputs per row, one FP8 block n_tile).
// NOTES:
// - Uniformity as v11: the warpgroup index, the tile-loop values (m0, m_end, n_tile, expert) and the stage-0
//   descriptor words are __shfl_sync broadcasts, so stage / phase / descriptor arithmetic is uniform.
// - A math warpgroup whose 64 rows hold no row of the expert releases every stage unread and skips the
//   epilogue (v9 runs it on zero accumulators and stores nothing: rows >= m_end are never stored, and
//   out_scales only for valid rows), so the global outputs are the same.
// - kTmaScales (K % 512 == 0, MEGAMOE_FP8_V11_TMA_SCALES): the NOTES above wide_produce_tile_tma_scales hold
//   unchanged (4 stages -> one A-scale group slot: 4 R >= kStages with R = 1). Rows past the expert's end get
//   foreign scales instead of 0: their accumulators are garbage either way and are never stored; the
//   epilogue's amax / scale of a row use only that row (quad shuffles over its own 4 lanes).
// - Shared memory (1024 experts): 196,608 tiles + 16,384 FP8 row staging (8 warps x one 2,048 B TMA-store box) +
//   2,080 scales (cp.async: 4 x 130 floats; TMA: 2,048 ring + 32 B scales) + 64 barriers + 12,300 tile table + 1,024
//   slack = 228,460 B.
// - Epilogue stores (docs/grouped_gemm.md "v11 GEMM 1 TMA-store epilogue"): swiglu_quant_fp8_rows_epilogue with
//   kTmaStore: a warp whose 16 rows are all the expert's writes them as one swizzled box and lane 0 stores it with one
//   TMA tensor store (out_map); the warp holding the expert's last rows keeps the per-row 1-D bulk copies.
//
// v11 GEMM 1 small (kBlockMValue = 64; docs/grouped_gemm.md "v11 GEMM 1 small"): the same kernel with a 64 x 256
// tile whose math warpgroups split N (warpgroup w = packed columns [128 w, 128 w + 128): gate and up of outputs
// [64 w, 64 w + 64)), for experts of <= ~56 rows, where the 128-row tile leaves one math warpgroup idle. Producer
// warpgroup unchanged; math: wide_gemm1_small_math (NOTES there). Shared memory (1024 experts): 163,840 tiles +
// 32,768 staging (the spread epilogue's FP32 gate / up of 32 rows; the 18,432 B FP8 row staging inside it) +
// 1,024 A-scale ring + 32 B scales (cp.async: 1,056 scale slots) + 1,024 amax exchange + 64 barriers + 12,300
// tile table + 1,024 slack = 212,076 B (both scale paths).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/sm90_fp8_grouped_gemm.cuh"
#include "kernels/sm90_fp8_wide_grouped_gemm.cuh"

namespace megamoe::kernels::sm90 {

// Member names as Fp8GemmShared, produce_fp8_tile_trimmed, produce_fp8_scales and the v11 kTmaScales
// producers read them (WideFp8Layout's scheme with v9's FP8 row staging instead of BF16 staging).
// kBlockMValue 128: v11 GEMM 1 (split-M); 64: v11 GEMM 1 small (split-N, "small" NOTES below), which adds the
// per-row amax exchange ([2 tile parities][2 math warpgroups][64 rows] floats, 1 KiB) after the scales.
// kClusterSizeValue 2: the cluster kernel (MEGAMOE_GEMM_CLUSTER=1, 128 x 256 only; docs/grouped_gemm.md "v11
// clusters"): same layout, `empty` counts both CTAs' math warps, B arrives in two multicast 128-row parts.
// kTmaBScalesValue (MEGAMOE_FP8_GEMM1_TMA_BSCALES, default on; kTmaScales and 128 x 256 only; "TMA B scales" NOTES
// above the kernel): the tile's gate / up block scales of each 4-k-block group ride in a 32-byte TMA box next to the
// A-scale group box (kBScaleRingOffset, one 128-byte slot per A-scale group slot); no scale warp, `full` counts 1
// arrival.
template <bool kTmaScalesValue, int kBlockMValue = 128, int kClusterSizeValue = 1, bool kTmaBScalesValue = false>
struct WideGemm1Layout {
  static_assert(kBlockMValue == 128 || kBlockMValue == 64, "128 x 256 (split-M) or 64 x 256 (split-N small)");
  static_assert(kClusterSizeValue == 1 || (kClusterSizeValue == 2 && kBlockMValue == 128),
                "v11 GEMM-1 clusters: pairs of 128 x 256 tiles");
  static_assert(!kTmaBScalesValue || (kTmaScalesValue && kBlockMValue == 128),
                "TMA B scales: with TMA A scales, 128 x 256 tiles");
  static constexpr bool kTmaBScales = kTmaBScalesValue;
  static constexpr int kBlockM = kBlockMValue;
  static constexpr int kBlockN = 256;  // packed gate/up columns: 128 outputs
  static constexpr int kClusterSize = kClusterSizeValue;
  // 128 x 256: the rows epilogue's TMA stores (swiglu_quant_fp8_rows_epilogue kTmaStore): out E4M3 [m_capacity rows]
  // [n / 2 bytes] in boxes of 16 rows x 128 B, 128-byte swizzle (launch_v11_kernel). 64 x 256 (small): FP8 rows by
  // 1-D bulk copies, no out map.
  static constexpr bool kTmaRowStore = kBlockMValue == 128;
  static constexpr int kOutMapRows = kTmaRowStore ? 16 : 0;
  static constexpr uint64_t out_row_bytes(int n) { return static_cast<uint64_t>(n) / 2; }
  static constexpr int kStageCount = 4;
  // Fp8GemmShared::init_barriers: `full` takes the scale warp's 32 cp.async arrivals unless the B scales come by TMA.
  static constexpr bool kScalesInShared = !kTmaBScalesValue;
  static constexpr bool kTmaScales = kTmaScalesValue;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kTilesBytes = kStageCount * (kABytes + kBBytes);
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "stage bases stay 1024-byte aligned (128-byte swizzle)");
  // Clusters: CTA r loads packed B rows [r kBBlockRows, (r + 1) kBBlockRows) of the tile (WideFp8Layout's NOTES).
  static constexpr int kBBlockRows = kBlockN / kClusterSize;
  static constexpr int kBBlockBytes = kBBlockRows * kBlockK;
  static_assert(kBBlockRows % 8 == 0 && kBBlockBytes % 1024 == 0, "B parts: whole 128-byte swizzle atoms");
  // FP8 row staging of swiglu_quant_fp8_rows_epilogue (Fp8GemmShared::fp8_row_staging = kTilesBytes): 8 math warps x
  // kFp8TmaStagingBytesPerWarp (kTmaRowStore: one 1024-aligned 16 x 128 B swizzled box per warp, 16,384 B) or 16 rows
  // x kFp8StagingPitch (18,432 B).
  static constexpr int kStagingOffset = kTilesBytes;
  static_assert(kStagingOffset % 1024 == 0, "TMA-store boxes 1024-byte aligned (128-byte swizzle)");
  static constexpr int kFp8RowStagingBytes =
      kMathWarpgroups * 4 * (kTmaRowStore ? kFp8TmaStagingBytesPerWarp : 16 * kFp8StagingPitch);
  // The small tile's spread epilogue (tiles of <= kSpreadRows rows; swiglu_quant_fp8_spread_epilogue, kInterleaved)
  // stages FP32 gate / up blocks of kSpreadRows rows in the same region (32 KiB): the region is the larger of the two.
  static constexpr int kSpreadRows = kBlockM == 64 ? 32 : 0;
  static constexpr int kSpreadBytes = 2 * kSpreadRows * 128 * 4;
  static constexpr int kStagingBytes = kFp8RowStagingBytes > kSpreadBytes ? kFp8RowStagingBytes : kSpreadBytes;
  static constexpr int kScaleGroupKBlocks = 4;
  static constexpr int kAScaleGroupBytes = kBlockM * kScaleGroupKBlocks * 4;
  static constexpr int kAScaleGroups = (kStageCount + kScaleGroupKBlocks - 1) / kScaleGroupKBlocks;
  static_assert(kScaleGroupKBlocks * kAScaleGroups >= kStageCount, "ring reuse bound (NOTES of the producer)");
  static constexpr int kAScaleRingOffset = kStagingOffset + kStagingBytes;
  static_assert(kAScaleRingOffset % 128 == 0, "TMA destinations 128-byte aligned");
  static constexpr int kAScaleRingBytes = kTmaScales ? kAScaleGroups * kAScaleGroupBytes : 0;
  static constexpr int kScaleFloats = kTmaScales ? 2 : kBlockM + 2;
  static constexpr int kBScaleIndex = kTmaScales ? 0 : kBlockM;  // [+0] gate block, [+1] up block
  // kTmaBScales: per A-scale group slot one 128-byte slot (TMA destination alignment) holding [gate, up][4 k-blocks]
  // fp32 (32 bytes: one box of the B-scale map, 16 bytes x 2 rows).
  static constexpr int kBScaleSlotBytes = 128;
  static constexpr int kBScaleBoxBytes = 2 * kScaleGroupKBlocks * 4;
  static constexpr int kBScaleRingOffset = kAScaleRingOffset + kAScaleRingBytes;
  static constexpr int kBScaleRingBytes = kTmaBScales ? kAScaleGroups * kBScaleSlotBytes : 0;
  static constexpr int kScalesOffset = kBScaleRingOffset + kBScaleRingBytes;
  static constexpr int kScalesBytes = (kStageCount * kScaleFloats * 4 + 15) / 16 * 16;
  static constexpr int kAmaxOffset = kScalesOffset + kScalesBytes;
  static constexpr int kAmaxBytes = kBlockM == 64 ? 2 * kMathWarpgroups * 64 * 4 : 0;
  static constexpr int kBarrierOffset = kAmaxOffset + kAmaxBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStageCount * 8;
  static constexpr int shared_bytes(int num_experts) { return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts); }
};

// One k-block of one math warpgroup after its `full` wait: v9's two groups (fp8_kblock_groups, kGroupsN 2,
// one sub-tile) with the uniform descriptor words a_low / b_low of this stage, the stage's gate / up B scales
// from `slot` (+ kBScaleIndex) and this thread's two rows' A scales. Releases the stage after the last group's
// wait and advances stage / phase. kHalves = 1 (the small tile): only the group of the n-half b_low points at
// (the caller offsets b_low by its warpgroup's 128 packed rows), with the same promotion (gate scale on even
// 8-column groups j, up scale on odd: every n-half has the same interleave).
// wide_gemm1_kblock_scaled: the same with the gate / up B scales given (kTmaBScales: from the B-scale ring).
template <class Layout, int kHalves = 2>
__device__ __forceinline__ void wide_gemm1_kblock_scaled(float (&accumulator)[kHalves][64], float (&partial)[64],
                                                         const Fp8GemmShared<Layout>& smem, float scale_b0,
                                                         float scale_b1, float scale_a0, float scale_a1,
                                                         uint32_t a_low, uint32_t b_low, int& stage, uint32_t& phase) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    wgmma_group_m64n128_e4m3(partial, a_low, b_low + ((128 * h * kBlockK) >> 4));
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
    if (h == kHalves - 1) {
      wide_release_stage<Layout::kClusterSize>(&smem.empty[stage]);
      stage = stage + 1 == Layout::kStageCount ? 0 : stage + 1;
      phase ^= stage == 0 ? 1u : 0u;
    }
    // fp8_kblock_groups' products and FFMAs (scale_b[n] = {gate, up} for both n-halves).
    const float scale00 = scale_a0 * scale_b0, scale01 = scale_a0 * scale_b1;
    const float scale10 = scale_a1 * scale_b0, scale11 = scale_a1 * scale_b1;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float scale0 = j % 2 ? scale01 : scale00, scale1 = j % 2 ? scale11 : scale10;
      accumulator[h][4 * j + 0] += partial[4 * j + 0] * scale0;
      accumulator[h][4 * j + 1] += partial[4 * j + 1] * scale0;
      accumulator[h][4 * j + 2] += partial[4 * j + 2] * scale1;
      accumulator[h][4 * j + 3] += partial[4 * j + 3] * scale1;
    }
  }
}

template <class Layout, int kHalves = 2>
__device__ __forceinline__ void wide_gemm1_kblock(float (&accumulator)[kHalves][64], float (&partial)[64],
                                                  const Fp8GemmShared<Layout>& smem, const float* slot,
                                                  float scale_a0, float scale_a1, uint32_t a_low, uint32_t b_low,
                                                  int& stage, uint32_t& phase) {
  const float scale_b0 = slot[Layout::kBScaleIndex], scale_b1 = slot[Layout::kBScaleIndex + 1];
  wide_gemm1_kblock_scaled<Layout, kHalves>(accumulator, partial, smem, scale_b0, scale_b1, scale_a0, scale_a1, a_low,
                                            b_low, stage, phase);
}

// The K loop of one tile for one math warpgroup (zeroes `accumulator`); stage / phase / scale_slot: the
// ring cursors (warp-uniform, carried across tiles); a_descriptor0 / b_descriptor0: stage-0 descriptor
// words of this warpgroup's A rows and the B tile; scale_row: this thread's first fragment row in the tile.
// kTmaScales: k-blocks in groups of 4 with the group's A scales loaded at its first k-block (as
// wide_fp8_tile_mainloop_tma_scales); otherwise per k-block from the stage's slot.
template <class Layout, int kHalves = 2>
__device__ __forceinline__ void wide_gemm1_tile_mainloop(float (&accumulator)[kHalves][64], float (&partial)[64],
                                                         const Fp8GemmShared<Layout>& smem, int k_blocks,
                                                         uint32_t a_descriptor0, uint32_t b_descriptor0, int scale_row,
                                                         int& stage, uint32_t& phase, int& scale_slot) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) accumulator[h][i] = 0.0f;
  if constexpr (Layout::kTmaScales) {
    constexpr int kGroupKBlocks = Layout::kScaleGroupKBlocks;
    const float4* const ring_row =
        reinterpret_cast<const float4*>(smem.a_tiles + Layout::kAScaleRingOffset) + scale_row;
#pragma unroll 1
    for (int group = 0; group < k_blocks / kGroupKBlocks; ++group) {
      float4 scales_a0, scales_a1;
      float4 gate_scales, up_scales;  // kTmaBScales: the group's [gate, up][4 k-blocks] B scales
#pragma unroll
      for (int j = 0; j < kGroupKBlocks; ++j) {
        barrier_wait(&smem.full[stage], phase);
        if (j == 0) {
          scales_a0 = ring_row[scale_slot * Layout::kBlockM];
          scales_a1 = ring_row[scale_slot * Layout::kBlockM + 8];
          if constexpr (Layout::kTmaBScales) {
            const float4* const b_slot = reinterpret_cast<const float4*>(
                smem.a_tiles + Layout::kBScaleRingOffset + scale_slot * Layout::kBScaleSlotBytes);
            gate_scales = b_slot[0];
            up_scales = b_slot[1];
          }
          scale_slot = scale_slot + 1 == Layout::kAScaleGroups ? 0 : scale_slot + 1;
        }
        if constexpr (Layout::kTmaBScales) {
          wide_gemm1_kblock_scaled<Layout, kHalves>(
              accumulator, partial, smem, float4_lane(gate_scales, j), float4_lane(up_scales, j),
              float4_lane(scales_a0, j), float4_lane(scales_a1, j), a_descriptor0 + stage * (Layout::kABytes >> 4),
              b_descriptor0 + stage * (Layout::kBBytes >> 4), stage, phase);
        } else {
          const float* slot = smem.scales + stage * Layout::kScaleFloats;
          wide_gemm1_kblock<Layout, kHalves>(accumulator, partial, smem, slot, float4_lane(scales_a0, j),
                                    float4_lane(scales_a1, j), a_descriptor0 + stage * (Layout::kABytes >> 4),
                                    b_descriptor0 + stage * (Layout::kBBytes >> 4), stage, phase);
        }
      }
    }
  } else {
#pragma unroll 1
    for (int kb = 0; kb < k_blocks; ++kb) {
      barrier_wait(&smem.full[stage], phase);
      const float* slot = smem.scales + stage * Layout::kScaleFloats;
      const float scale_a0 = slot[scale_row], scale_a1 = slot[scale_row + 8];
      wide_gemm1_kblock<Layout, kHalves>(accumulator, partial, smem, slot, scale_a0, scale_a1,
                                a_descriptor0 + stage * (Layout::kABytes >> 4),
                                b_descriptor0 + stage * (Layout::kBBytes >> 4), stage, phase);
    }
  }
}

// v11 GEMM 1 small: the math warpgroups of a 64 x 256 tile (Layout::kBlockM == 64). Both hold the tile's 64 rows;
// warpgroup w runs the n-half w (packed columns [128 w, 128 w + 128): gate and up of outputs [64 w, 64 w + 64) of
// block n_tile, interleaved by 8) with v11 GEMM 1's k-block (kHalves = 1), then swiglu_quant_fp8_rows_epilogue
// with kHalves = 1 and the per-row amax exchange (RowsAmaxExchange, named barrier kSmallAmaxBarrier); tiles of
// <= kSpreadRows (32) rows with params.swiglu_spread (MEGAMOE_SWIGLU_SPREAD, default on) take the spread epilogue
// instead (kInterleaved: all 8 math warps finish whole rows, as the split-N 64-row tile does).
// NOTES:
// - Bit-identical to v9 / v11: an element's 128-K partial comes from the same 4 wgmma k32 steps (m64n128k32 on
//   the same A rows and B rows; the partial does not depend on which warpgroup issues it or at which A row
//   offset the 64 rows sit), promoted with the same (scale_a * gate / up scale) FFMA in the same k order; the
//   epilogue's per-element operations are v9's, the amax an exact max over the same 128 values.
// - Both math warpgroups run every tile (every tile holds >= 1 row of its expert), so the named barrier of the
//   amax exchange is reached by all 256 math threads once per tile, and the tile parity that double-buffers
//   the exchange is the same on both sides (RowsAmaxExchange NOTES).
// - Uniformity: math_wg / warp / per-tile values are broadcasts (as v11); b_descriptor0 includes the
//   warpgroup's n-half offset (128 rows x 128 B = 16 KiB: >> 4 = 1024 in the descriptor's address word).
// - The amax exchange buffer [parity][warpgroup][64] sits at Layout::kAmaxOffset, nothing else uses it. Every
//   256-thread barrier between two uses of one parity orders them, the spread epilogue's three included (its
//   tiles flip the parity too).
// - The spread epilogue's FP32 staging (32 KiB) aliases the FP8 row staging: (a) before its writes every lane ran
//   bulk_wait_all_read (the rows epilogue's copies of earlier tiles, issued by lanes < 16) and the spread's first
//   barrier; (b) its last barrier (every row read) comes before any later tile's rows-epilogue staging write.
//   It shares named barrier kSmallAmaxBarrier with the amax exchange: the branch is CTA-uniform (m0, m_end), so
//   all 256 math threads run the same barrier sequence.
constexpr uint32_t kSmallAmaxBarrier = 1;
template <class Layout>
__device__ __forceinline__ void wide_gemm1_small_math(const Fp8GemmShared<Layout>& smem, const ExpertTileTable& table,
                                                      const GroupedGemmParams& params, int math_wg, int warp_in_wg,
                                                      int lane, int k_blocks, int n_tiles, int total_tiles) {
  static_assert(Layout::kBlockM == 64, "the small tile");
  const int row_in_tile = warp_in_wg * 16 + lane / 4;  // this thread's fragment row 0 (both warpgroups)
  const uint32_t a_descriptor0 = __shfl_sync(0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.a_tiles)), 0);
  const uint32_t b_descriptor0 = __shfl_sync(
      0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.b_tiles + math_wg * 128 * kBlockK)), 0);
  float* const amax_buffer = reinterpret_cast<float*>(smem.a_tiles + Layout::kAmaxOffset);
  int stage = 0;
  uint32_t phase = 0;
  int scale_slot = 0;
  int expert = 0;
  int parity = 0;
  float accumulator[1][64];
  float partial[64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile_ordered(table, tile, n_tiles, Layout::kBlockM, expert, params.m_fastest);
    const int m0 = __shfl_sync(0xffffffffu, t.m0, 0);
    const int m_end = __shfl_sync(0xffffffffu, t.m_end, 0);
    const int n_tile = __shfl_sync(0xffffffffu, t.n_tile, 0);
    expert = __shfl_sync(0xffffffffu, expert, 0);
    wide_gemm1_tile_mainloop<Layout, 1>(accumulator, partial, smem, k_blocks, a_descriptor0, b_descriptor0,
                                        row_in_tile, stage, phase, scale_slot);
    if (params.swiglu_spread && m_end - m0 <= Layout::kSpreadRows) {  // CTA-uniform
      // The spread epilogue's staging aliases the FP8 row staging: every lane's earlier bulk copies (the rows
      // epilogue's, lanes < 16) have read it before the spread epilogue's first barrier.
      bulk_wait_all_read();
      swiglu_quant_fp8_spread_epilogue<Layout::kSpreadRows, false, false, true>(
          accumulator[0], reinterpret_cast<float*>(smem.fp8_row_staging), math_wg, m0, m_end - m0, n_tile,
          params.n / 2, params.topk_weights, static_cast<uint8_t*>(params.out), params.out_scales, params.activation,
          params.limit, params.alpha, kSmallAmaxBarrier);
    } else {
      float* const exchange = amax_buffer + parity * (2 * 64);
      const RowsAmaxExchange combine{exchange + math_wg * 64, exchange + (1 - math_wg) * 64, row_in_tile,
                                     kSmallAmaxBarrier};
      swiglu_quant_fp8_rows_epilogue<false, 1>(accumulator, smem.fp8_row_staging, m0, m_end, n_tile, params.n / 2,
                                               params.topk_weights, static_cast<uint8_t*>(params.out),
                                               params.out_scales, params.activation, params.limit, params.alpha,
                                               64 * math_wg, combine);
    }
    parity ^= 1;
  }
  bulk_wait_all();  // the epilogue's bulk copies
}

// params as the v9 launch (grouped_gemm1_fp8): n = 2 intermediate (packed), k = hidden, out E4M3 [rows, n / 2],
// out_scales [rows, n / 256], activation / limit / alpha, topk_weights. scale_map: the A scales as bytes
// (kTmaScales only). kBlockMValue: 128 (v11 GEMM 1) or 64 (v11 GEMM 1 small); the producer warpgroup's code is
// the same for both (the tile height enters through Layout), the math warpgroups' differs (split-M vs split-N).
// kCluster (128 x 256 only; launched with cluster dims (2, 1, 1)): the cluster-of-2 schedule (locate_cluster_tile:
// pairs of m-tiles of one expert and n-tile sharing the B tile by multicast halves, lone units for an odd last
// m-tile): the scheme, barrier protocol and invariants of sm90_fp8_wide_grouped_gemm_kernel's kCluster NOTES,
// unchanged (wide_produce_tile_cluster, wide_release_stage, the start / exit cluster barriers).
//
// TMA B scales (kTmaBScales, MEGAMOE_FP8_GEMM1_TMA_BSCALES, default on; with kTmaScales, 128 x 256 tiles, plain or
// clusters): b_scale_map views params.b_scales [num_experts x n / 128 rows][k / 128] fp32 (as bytes), boxes of 16 bytes
// x 2 rows: the tile's gate row (b_row / 128 = expert x n / 128 + 2 n_tile) and up row, 4 k-blocks. The TMA producer
// loads that box with every A-scale group box (into Layout::kBScaleRingOffset + slot x 128), and counts its 32 bytes in
// the stage's expect; the math warps read it at the group's first k-block with the A scales. Warp 1 then has no
// per-stage work (the tile table only) and `full` takes 1 arrival (Layout::kScalesInShared = false).
// NOTES:
// - Ring reuse: the B slot is the A-scale group slot's twin (same index, same producer instruction stream, same
//   `full`), so the A-scale ring argument (wide_produce_tile_tma_scales NOTES: 4 R >= kStages) covers it: the math
//   warps read both slots at the group's first k-block, before that k-block's release, and the producer refills the
//   slot only after that release.
// - Same floats as the scale warp's cp.async copies, the same products (scale_a x scale_b) in the same order:
//   outputs bit-identical to kTmaBScales = false.
// - Clusters: each CTA loads the B scales of its own tile (pairs share n_tile; lone units have one each); a CTA without
//   a tile loads none (no scale box, as for the A scales).
template <bool kTmaScales, int kBlockMValue = 128, bool kCluster = false, bool kTmaBScales = false>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_fp8_wide_gemm1_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                               const __grid_constant__ CUtensorMap scale_map,
                               const __grid_constant__ CUtensorMap out_map,
                               const __grid_constant__ CUtensorMap b_scale_map,
                               const GroupedGemmParams params) {
  static_assert(!kCluster || kBlockMValue == 128, "clusters: the 128 x 256 tile");
  using Layout = WideGemm1Layout<kTmaScales, kBlockMValue, kCluster ? 2 : 1, kTmaBScales>;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kBlockN = Layout::kBlockN;
  constexpr int kStages = Layout::kStageCount;

  extern __shared__ uint8_t shared_raw[];
  const Fp8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);

  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
  const auto [cta_rank, first_unit, unit_step] = wide_unit_walk<kCluster>();
  wide_start<kTmaScales>(smem, &a_map, &b_map, &scale_map);
  if constexpr (kTmaBScales)
    if (threadIdx.x == 0) prefetch_tensor_map(&b_scale_map);
  const int k_blocks = params.k / kBlockK;
  const int n_tiles = params.n / kBlockN;
  const int n_blocks = params.n / 128;
  const int total_units = wide_schedule<kBlockM, kCluster>(table, params, warp, n_tiles);

  // kCluster: 40 + 2 x 232 (as the GEMM-2 cluster kernel: the cluster producer spills at 24).
  constexpr uint32_t kProducerRegs = kCluster ? 40 : 24;
  constexpr uint32_t kMathRegs = kCluster ? 232 : 240;
  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    // The scale warp: (A scales,) the tile's gate block 2 n_tile and up block 2 n_tile + 1 (none with kTmaBScales).
    if (warp == 1 && !kTmaBScales) {
      PipelineCursor<kStages> cursor;
      int expert = 0;
      for (int unit = first_unit; unit < total_units; unit += unit_step) {
        const ClusterTileCoordinates where =
            locate_unit<kCluster>(table, unit, n_tiles, kBlockM, cta_rank, expert, params.m_fastest);
        const float* gate_scales =
            params.b_scales + (static_cast<int64_t>(expert) * n_blocks + 2 * where.n_tile) * k_blocks;
        wide_produce_scales<kTmaScales>(smem, params.a_scales, gate_scales, gate_scales + k_blocks, where.m0,
                                        where.m_end, k_blocks, cursor);
      }
      cp_async_wait_all();
    } else if (threadIdx.x == 0) {
      PipelineCursor<kStages> cursor;
      int expert = 0;
      int scale_slot = 0;
      for (int unit = first_unit; unit < total_units; unit += unit_step) {
        const ClusterTileCoordinates where =
            locate_unit<kCluster>(table, unit, n_tiles, kBlockM, cta_rank, expert, params.m_fastest);
        const int b_row = expert * params.n + where.n_tile * kBlockN;
        // n % 256 == 0: a B part never starts past the last expert's rows (never moved).
        wide_produce_tile<kTmaScales, kCluster>(smem, &a_map, &b_map, &scale_map, where.m0, where.m_end, b_row,
                                                params.num_experts * params.n, where.shared_b, cta_rank, k_blocks,
                                                cursor, scale_slot, &b_scale_map, b_row / 128);
      }
    }
  } else {
    registers_increase<kMathRegs>();
    const int math_wg = warpgroup - 1;
    const int lane = threadIdx.x % 32;
    const int warp_in_wg = warp % 4;
    if constexpr (kBlockM == 64) {
      wide_gemm1_small_math(smem, table, params, math_wg, warp_in_wg, lane, k_blocks, n_tiles, total_units);
    } else {
      const int scale_row = math_wg * 64 + warp_in_wg * 16 + lane / 4;  // A-scale row of fragment row 0
      const uint32_t a_descriptor0 = __shfl_sync(
          0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.a_tiles + math_wg * 64 * kBlockK)), 0);
      const uint32_t b_descriptor0 =
          __shfl_sync(0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.b_tiles)), 0);

      int stage = 0;
      uint32_t phase = 0;
      int scale_slot = 0;  // kTmaScales: A-scale group ring cursor
      int expert = 0;
      float accumulator[2][64];
      float partial[64];
      if (threadIdx.x % 128 == 0) prefetch_tensor_map(&out_map);
      for (int unit = first_unit; unit < total_units; unit += unit_step) {
        const ClusterTileCoordinates t =
            locate_unit<kCluster>(table, unit, n_tiles, kBlockM, cta_rank, expert, params.m_fastest);
        const int m0 = __shfl_sync(0xffffffffu, t.m0, 0);
        const int m_end = __shfl_sync(0xffffffffu, t.m_end, 0);
        const int n_tile = __shfl_sync(0xffffffffu, t.n_tile, 0);
        expert = __shfl_sync(0xffffffffu, expert, 0);
        // None of this warpgroup's rows (kCluster: also a CTA without a tile, m_end <= m0): release every stage
        // unread.
        if (m_end - m0 <= 64 * math_wg) {
#pragma unroll 1
          for (int kb = 0; kb < k_blocks; ++kb) {
            barrier_wait(&smem.full[stage], phase);
            wide_release_stage<Layout::kClusterSize>(&smem.empty[stage]);
            stage = stage + 1 == kStages ? 0 : stage + 1;
            phase ^= stage == 0 ? 1u : 0u;
          }
          if constexpr (kTmaScales)
            scale_slot = (scale_slot + k_blocks / Layout::kScaleGroupKBlocks) % Layout::kAScaleGroups;
          continue;
        }
        wide_gemm1_tile_mainloop<Layout>(accumulator, partial, smem, k_blocks, a_descriptor0, b_descriptor0,
                                         scale_row, stage, phase, scale_slot);
        swiglu_quant_fp8_rows_epilogue<false, 2, RowsAmaxLocal, Layout::kTmaRowStore>(
            accumulator, smem.fp8_row_staging, m0 + math_wg * 64, m_end, n_tile, params.n / 2, params.topk_weights,
            static_cast<uint8_t*>(params.out), params.out_scales, params.activation, params.limit, params.alpha, 0,
            RowsAmaxLocal{}, &out_map);
      }
      bulk_wait_all();  // the epilogue's bulk copies and TMA stores
    }
  }
  // kCluster: no CTA leaves while its peer may still arrive on its barriers.
  if constexpr (kCluster) cluster_sync();
}

}  // namespace megamoe::kernels::sm90

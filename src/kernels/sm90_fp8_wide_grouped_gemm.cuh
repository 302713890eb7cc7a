// v11: plain FP8-block grouped GEMM with BF16 out (GEMM 2), 128 x kBlockN tiles, one wgmma group per
// warpgroup and k-block, warp-uniform pipeline and descriptor arithmetic (docs/grouped_gemm.md "v11").
//
//   out[r, n] = bf16_rn( sum_kb ( sum_{k in kb} e4m3(A[r,k]) e4m3(B_e[n,k]) ) * (a_scale[r,kb] * b_scale_e[n/128,kb]) )
//
// Same contract as the plain / GEMM-2 path of sm90_fp8_grouped_gemm.cuh (grouped_gemm.h), and the same
// per-element arithmetic: each 128-K FP8 partial comes from 4 wgmma k32 steps, then
// acc += partial * (a_scale * b_scale) (one FFMA, FP32), in k-block order, so outputs are bit-identical to
// the kSplitMSmall / kSplitMLarge kernels (the partial of an m64nNk32 element does not depend on N: tested).
//
// CTA = 3 warpgroups, 384 threads, persistent (one CTA per SM):
// - warpgroup 0: thread 0 streams A (two 64-row boxes, trimmed to the expert's rows) and B (one kBlockN-row
//   box) per 128-K stage with TMA (produce_fp8_tile_trimmed); warp 1 stages the tile's 128 A scales (0 past
//   the expert's end) and the two B block scales of the stage with cp.async (produce_fp8_scales).
// - warpgroups 1, 2: tile rows [64 w, 64 w + 64) (w = math warpgroup), all kBlockN columns: per k-block
//   wait `full`, read the scales, ONE group of 4 wgmma m64n{kBlockN}k32, commit, wait 0, release the stage,
//   promote kBlockN / 2 FFMA. Then the BF16 epilogue through per-warp swizzled staging and TMA tensor stores.
// NOTES:
// - Uniformity (the point of v11; v10's k-block had 4 R2UR per wgmma): the warpgroup index, the tile loop
//   bound and every per-tile value are broadcast from lane 0 with __shfl_sync, so the tile loop and the k
//   loop are warp-uniform control flow and the stage index / phase / descriptor words live in uniform
//   registers (UIADD3 / UIMAD), not rebuilt per thread and moved with R2UR.
// - B block scales: a kBlockN = 192 tile straddles two 128-column scale blocks. The scale slot holds
//   [kBlockM] = block n0 / 128 and [kBlockM + 1] = the next block (clamped to the last one; columns past n
//   are never stored). Columns [0, 128 - n0 % 128) of the tile use the first: with n0 = 192 t that is 16 of
//   the 24 8-column groups (t even) or 8 (t odd); the k loop is instantiated per case (kFormerGroups), so the
//   choice is compile-time per register (no selects in the promotion).
// - n % kBlockN != 0: the last n-tile's B box reads past the expert's n rows (the next expert's rows, or
//   zeros past the last expert): those columns are computed and never stored (the epilogue copies
//   min(kBlockN, n - n0) columns per row).
// - A math warpgroup whose 64 rows hold no row of the expert waits on and releases every stage unread and
//   stores nothing (its A chunk was not loaded: trimmed).
// - kTmaScales (MEGAMOE_FP8_V11_TMA_SCALES=1, K % 512 == 0): the producer thread also loads the A scales by
//   TMA, 4 k-blocks x 128 rows per box, and the scale warp stages only the B scales (NOTES above
//   wide_produce_tile_tma_scales).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/sm90_cluster_pipeline.cuh"
#include "kernels/sm90_fp8_grouped_gemm.cuh"

namespace megamoe::kernels::sm90 {

// Shared-memory layout of the v11 kernel, in the member names Fp8GemmShared, produce_fp8_tile_trimmed and
// produce_fp8_scales read. Tiles, then BF16 staging (8 math warps x kStagingRowsPerWarp rows x pitch), then
// the scale ring ([kStages][kBlockM + 2]), barriers, the expert tile table.
//   128 x 128, 6 stages:  196,608 tiles + 16,384 staging (8 rows) + 3,120 scales -> 229,532 B at 1024 experts
//   128 x 192, 4 stages:  163,840 tiles + 49,152 staging (16 rows) + 2,080 scales -> 228,460 B
// kTmaScales: 128 x 128: 4,096 A-scale ring (2 groups) + 48 B scales -> 230,556 B; 128 x 192: 2,048 (1
// group) + 32 -> 228,460 B.
// (with 96 / 64 B of barriers, the 12,300 B tile table at kMaxExperts and 1,024 B alignment slack; the
// limit is 232,448 B).
// kClusterSizeValue: 1, or 2 for the cluster kernel (MEGAMOE_GEMM_CLUSTER=1; docs/grouped_gemm.md "v11 clusters"):
// same layout, `empty` counts the math warps of both CTAs, B arrives in two multicast halves.
// kTmaBScalesValue (MEGAMOE_FP8_V11_TMA_BSCALES, default on, with kTmaScales; "TMA B scales" below): the tile's two B
// block scale rows of each 4-k-block group in a 32-byte TMA box next to the A-scale group box; no scale warp.
template <int kBlockNValue, bool kTmaScalesValue = false, int kClusterSizeValue = 1, bool kTmaBScalesValue = false>
struct WideFp8Layout {
  static_assert(kBlockNValue == 128 || kBlockNValue == 192, "v11 tiles: 128 x 128 or 128 x 192");
  static_assert(kClusterSizeValue == 1 || kClusterSizeValue == 2, "v11 clusters: 1 or 2 CTAs");
  static_assert(!kTmaBScalesValue || kTmaScalesValue, "TMA B scales: with TMA A scales");
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kBlockNValue;
  static constexpr int kClusterSize = kClusterSizeValue;
  static constexpr int kStageCount = kBlockN == 128 ? 6 : 4;
  // Fp8GemmShared::init_barriers: `full` takes the scale warp's 32 cp.async arrivals unless the B scales come by TMA.
  static constexpr bool kScalesInShared = !kTmaBScalesValue;
  static constexpr bool kTmaScales = kTmaScalesValue;
  static constexpr bool kTmaBScales = kTmaBScalesValue;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kTilesBytes = kStageCount * (kABytes + kBBytes);
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "stage bases stay 1024-byte aligned (128-byte swizzle)");
  // Clusters: CTA r of the pair loads B rows [r kBBlockRows, (r + 1) kBBlockRows) of the tile (96 or 64 rows: whole
  // 8-row swizzle atoms, so the half lands 1024-byte aligned at r kBBlockBytes and the two halves form the same
  // image as one kBlockN-row box) and multicasts them to both CTAs.
  static constexpr int kBBlockRows = kBlockN / kClusterSize;
  static constexpr int kBBlockBytes = kBBlockRows * kBlockK;
  static_assert(kBBlockRows % 8 == 0 && kBBlockBytes % 1024 == 0, "B parts: whole 128-byte swizzle atoms");
  // Staging of store_bf16_epilogue_tma: per math warp kStagingRowsPerWarp rows x kBlockN BF16 as kBlockN / 64 boxes
  // of the out map ([kStagingRowsPerWarp rows][128 B], 128-byte swizzle: whole 1024-byte atoms, so every box is
  // 1024-byte aligned from the 1024-aligned stage end).
  static constexpr int kStagingRowsPerWarp = kBlockN == 128 ? 8 : 16;  // 8: one row half per chunk
  static constexpr int kOutMapRows = kStagingRowsPerWarp;               // the out map's box rows (launch_v11_kernel)
  static constexpr uint64_t out_row_bytes(int n) { return static_cast<uint64_t>(n) * 2; }  // BF16 [m_capacity, n]
  static constexpr int kStagingBytesPerWarp = bf16_tma_staging_bytes_per_warp<kBlockN, kStagingRowsPerWarp>();
  static constexpr int kStagingOffset = kTilesBytes;
  static constexpr int kStagingBytes = kMathWarpgroups * 4 * kStagingBytesPerWarp;
  // kTmaScales (MEGAMOE_FP8_V11_TMA_SCALES=1, K % 512 == 0): a ring of kAScaleGroups A-scale tiles of 4
  // k-blocks ([kBlockM rows][4] fp32, 2 KiB, one TMA box each; see wide_produce_tile_tma_scales), then the
  // per-stage B scales only ([kStages][2]). Otherwise no ring and the per-stage [kBlockM + 2] slot.
  static constexpr int kScaleGroupKBlocks = 4;
  static constexpr int kAScaleGroupBytes = kBlockM * kScaleGroupKBlocks * 4;
  static constexpr int kAScaleGroups = (kStageCount + kScaleGroupKBlocks - 1) / kScaleGroupKBlocks;
  static_assert(kScaleGroupKBlocks * kAScaleGroups >= kStageCount, "ring reuse bound (NOTES of the producer)");
  static constexpr int kAScaleRingOffset = kStagingOffset + kStagingBytes;
  static_assert(kAScaleRingOffset % 128 == 0, "TMA destinations 128-byte aligned");
  static constexpr int kAScaleRingBytes = kTmaScales ? kAScaleGroups * kAScaleGroupBytes : 0;
  static constexpr int kScaleFloats = kTmaScales ? 2 : kBlockM + 2;
  static constexpr int kBScaleIndex = kTmaScales ? 0 : kBlockM;  // [kBScaleIndex + {0, 1}] of a stage's slot
  // kTmaBScales: per A-scale group slot one 128-byte slot (TMA destination alignment) holding [block0, block0 + 1]
  // [4 k-blocks] fp32 (32 bytes: one box of the B-scale map, 16 bytes x 2 rows).
  static constexpr int kBScaleSlotBytes = 128;
  static constexpr int kBScaleBoxBytes = 2 * kScaleGroupKBlocks * 4;
  static constexpr int kBScaleRingOffset = kAScaleRingOffset + kAScaleRingBytes;
  static constexpr int kBScaleRingBytes = kTmaBScales ? kAScaleGroups * kBScaleSlotBytes : 0;
  static constexpr int kScalesOffset = kBScaleRingOffset + kBScaleRingBytes;
  static constexpr int kScalesBytes = (kStageCount * kScaleFloats * 4 + 15) / 16 * 16;
  static constexpr int kBarrierOffset = kScalesOffset + kScalesBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStageCount * 8;
  static constexpr int shared_bytes(int num_experts) { return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts); }
};

template <int kN>
__device__ __forceinline__ void wgmma_e4m3_wide(float (&d)[kN / 2], uint64_t a_descriptor, uint64_t b_descriptor,
                                                uint32_t accumulate) {
  if constexpr (kN == 128) wgmma_m64n128k32_e4m3(d, a_descriptor, b_descriptor, accumulate);
  else wgmma_m64n192k32_e4m3(d, a_descriptor, b_descriptor, accumulate);
}

// wide_release_stage: sm90_cluster_pipeline.cuh (shared with the BF16 cluster kernel).

// One k-block of one math warpgroup, after its `full` wait (both K loops below): the 4 wgmma of the stage into
// `partial`, wait, release the stage, advance the cursor, promote with this thread's two rows' A scales and the
// tile's two B block scales (8-column groups j < kFormerGroups take B scale 0). Per element the arithmetic of
// fp8_kblock_groups: scale00 = scale_a * scale_b, acc += partial * scale00.
template <class Layout, int kFormerGroups>
__device__ __forceinline__ void wide_fp8_kblock(float (&accumulator)[Layout::kBlockN / 2],
                                                float (&partial)[Layout::kBlockN / 2],
                                                const Fp8GemmShared<Layout>& smem, uint32_t a_descriptor0,
                                                uint32_t b_descriptor0, float scale_a0, float scale_a1,
                                                float scale_b0, float scale_b1, int& stage, uint32_t& phase) {
  constexpr int kRegisters = Layout::kBlockN / 2;
  constexpr int kStages = Layout::kStageCount;
  const uint32_t a_low = a_descriptor0 + stage * (Layout::kABytes >> 4);
  const uint32_t b_low = b_descriptor0 + stage * (Layout::kBBytes >> 4);
#pragma unroll
  for (int i = 0; i < kRegisters; ++i) fence_operand(partial[i]);
  wgmma_fence();
#pragma unroll
  for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
    wgmma_e4m3_wide<Layout::kBlockN>(partial, sw128_descriptor_from_low(a_low + ((32 * k_step) >> 4)),
                                     sw128_descriptor_from_low(b_low + ((32 * k_step) >> 4)), k_step > 0 ? 1u : 0u);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kRegisters; ++i) fence_operand(partial[i]);
  wide_release_stage<Layout::kClusterSize>(&smem.empty[stage]);
  stage = stage + 1 == kStages ? 0 : stage + 1;
  phase ^= stage == 0 ? 1u : 0u;
  const float scale00 = scale_a0 * scale_b0, scale01 = scale_a0 * scale_b1;
  const float scale10 = scale_a1 * scale_b0, scale11 = scale_a1 * scale_b1;
#pragma unroll
  for (int j = 0; j < kRegisters / 4; ++j) {
    const float scale0 = j < kFormerGroups ? scale00 : scale01, scale1 = j < kFormerGroups ? scale10 : scale11;
    accumulator[4 * j + 0] += partial[4 * j + 0] * scale0;
    accumulator[4 * j + 1] += partial[4 * j + 1] * scale0;
    accumulator[4 * j + 2] += partial[4 * j + 2] * scale1;
    accumulator[4 * j + 3] += partial[4 * j + 3] * scale1;
  }
}

// The K loop of one tile for one math warpgroup (zeroes `accumulator`). stage / phase: the ring cursor
// (warp-uniform, carried across tiles). a_descriptor0 / b_descriptor0: descriptor start-address words of
// this warpgroup's A rows and the B tile in stage 0 (uniform). scale_row: this thread's first fragment row
// inside the tile (its second is + 8). kFormerGroups: as wide_fp8_kblock.
template <class Layout, int kFormerGroups>
__device__ __forceinline__ void wide_fp8_tile_mainloop(float (&accumulator)[Layout::kBlockN / 2],
                                                       float (&partial)[Layout::kBlockN / 2],
                                                       const Fp8GemmShared<Layout>& smem, int k_blocks,
                                                       uint32_t a_descriptor0, uint32_t b_descriptor0, int scale_row,
                                                       int& stage, uint32_t& phase) {
#pragma unroll
  for (int i = 0; i < Layout::kBlockN / 2; ++i) accumulator[i] = 0.0f;
#pragma unroll 1
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.full[stage], phase);
    const float* slot = smem.scales + stage * Layout::kScaleFloats;
    const float scale_a0 = slot[scale_row], scale_a1 = slot[scale_row + 8];
    const float scale_b0 = slot[Layout::kBScaleIndex], scale_b1 = slot[Layout::kBScaleIndex + 1];
    wide_fp8_kblock<Layout, kFormerGroups>(accumulator, partial, smem, a_descriptor0, b_descriptor0, scale_a0, scale_a1,
                                          scale_b0, scale_b1, stage, phase);
  }
}

// ---- kTmaScales (MEGAMOE_FP8_V11_TMA_SCALES=1, K % 512 == 0; docs/grouped_gemm.md "v11 TMA scales") ----
// A scales by TMA instead of 128 cp.async per stage: the scales [m_capacity, k_blocks] fp32 as a 2-D byte
// map [m_capacity rows, 4 k_blocks bytes] with a box of 16 bytes x 128 rows (no swizzle; the row stride
// 4 k_blocks must be a multiple of 16, hence K % 512 == 0), one box per 4 k-blocks: tile rows m0 ..
// m0 + 127, k-blocks kb .. kb + 3, into A-scale group slot `scale_slot` ([128 rows][4], 2 KiB).
// NOTES (the scheme):
// - The box of k-blocks 4g .. 4g + 3 of a tile is issued with k-block 4g and counted (2,048 bytes, also
//   when TMA zero-fills rows past m_capacity) on that stage's `full` barrier: no barriers of its own.
//   k_blocks % 4 == 0, so groups never straddle tiles and the CTA's running k-block count is 4 x its
//   running group count on both sides (group slot = running group count mod kAScaleGroups).
// - The math threads read all 4 k-blocks' scales of their 2 rows (2 x ld.shared.v4) right after the
//   `full` wait of k-block 4g and keep them in registers for 4g .. 4g + 3, so a group slot is dead once
//   every math warp released the stage of k-block 4g. The producer rewrites slot g mod R with k-block
//   4 (g + R), after its `empty` wait for that stage, which guarantees that k-block 4 (g + R) - kStages
//   was released; 4 R >= kStages (R = kAScaleGroups = ceil(kStages / 4): 2 at 6 stages, 1 at 4) makes
//   that k-block >= 4g. Warpgroups without rows release without reading, which is as good.
// - Rows past the expert's end get the next expert's (or padding's) real scales instead of 0: their
//   accumulator rows are garbage either way (the cp.async path already multiplied unloaded / foreign A
//   rows by 0, which is not a guarantee of finiteness either: 0 x NaN), never stored (the epilogue copies
//   rows < m_end only) and rows do not mix (promotion, epilogue are per row). Valid rows read the same
//   floats as the cp.async path and the FFMA sequence is unchanged: bit-identical outputs.
// - B scales stay on the scale warp (2 per stage, [kBScaleIndex + {0, 1}]; `full` keeps 1 + 32 arrivals), unless
//   kTmaBScales: then a 16-byte x 2-row box of them rides with each A-scale group box (the kernels' "TMA B scales").

// Component `lane` of v (lane a constant after unrolling: folds to a register, no local memory).
__device__ __forceinline__ float float4_lane(const float4& v, int lane) {
  return lane == 0 ? v.x : lane == 1 ? v.y : lane == 2 ? v.z : v.w;
}

// Producer thread, kTmaScales: produce_fp8_tile_trimmed + the A-scale group box every 4th k-block.
template <class Layout>
__device__ __forceinline__ void wide_produce_tile_tma_scales(const Fp8GemmShared<Layout>& smem,
                                                             const CUtensorMap* a_map, const CUtensorMap* b_map,
                                                             const CUtensorMap* scale_map, int m0, int m_end,
                                                             int b_row, int k_blocks,
                                                             PipelineCursor<Layout::kStageCount>& cursor,
                                                             int& scale_slot, const CUtensorMap* b_scale_map = nullptr,
                                                             int b_scale_row = 0) {
  static_assert(Layout::kBlockM % kATrimRows == 0, "whole 64-row chunks");
  constexpr int kChunkBytes = kATrimRows * kBlockK;
  constexpr bool kTmaBScales = Layout::kTmaBScales;
  constexpr int kScaleBoxBytes = Layout::kAScaleGroupBytes + (kTmaBScales ? Layout::kBScaleBoxBytes : 0);
  uint8_t* const ring = smem.a_tiles + Layout::kAScaleRingOffset;
  const int chunks = min((m_end - m0 + kATrimRows - 1) / kATrimRows, Layout::kBlockM / kATrimRows);
  for (int kb = 0; kb < k_blocks; ++kb) {
    const bool group = kb % Layout::kScaleGroupKBlocks == 0;
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    barrier_arrive_expect_bytes(&smem.full[cursor.stage],
                                chunks * kChunkBytes + Layout::kBBytes + (group ? kScaleBoxBytes : 0));
    uint8_t* a_stage = smem.a_tiles + cursor.stage * Layout::kABytes;
    for (int c = 0; c < chunks; ++c)
      tma_load_2d(a_stage + c * kChunkBytes, a_map, kb * kBlockK, m0 + c * kATrimRows, &smem.full[cursor.stage]);
    tma_load_2d(smem.b_tiles + cursor.stage * Layout::kBBytes, b_map, kb * kBlockK, b_row, &smem.full[cursor.stage]);
    if (group) {
      tma_load_2d(ring + scale_slot * Layout::kAScaleGroupBytes, scale_map, kb * 4, m0, &smem.full[cursor.stage]);
      if constexpr (kTmaBScales)
        tma_load_2d(smem.a_tiles + Layout::kBScaleRingOffset + scale_slot * Layout::kBScaleSlotBytes, b_scale_map,
                    kb * 4, b_scale_row, &smem.full[cursor.stage]);
      scale_slot = scale_slot + 1 == Layout::kAScaleGroups ? 0 : scale_slot + 1;
    }
    cursor.advance();
  }
}

// Scale warp, kTmaScales: only the two B block scales per stage (cp.async, one .noinc arrival per lane:
// `full`'s arrival count is that of the cp.async path).
template <class Layout>
__device__ __forceinline__ void wide_produce_b_scales(const Fp8GemmShared<Layout>& smem, const float* b_scales0,
                                                      const float* b_scales1, int k_blocks,
                                                      PipelineCursor<Layout::kStageCount>& cursor) {
  const int lane = threadIdx.x % 32;
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    float* slot = smem.scales + cursor.stage * Layout::kScaleFloats + Layout::kBScaleIndex;
    if (lane < 2) cp_async_4(slot + lane, (lane == 0 ? b_scales0 : b_scales1) + kb, 4u);
    cp_async_arrive_noinc(&smem.full[cursor.stage]);
    cursor.advance();
  }
}

// wide_fp8_tile_mainloop with kTmaScales: k-blocks in groups of 4 (k_blocks % 4 == 0), the group's A
// scales of this thread's two rows loaded at its first k-block (NOTES above); per k-block the same
// instructions and FFMA order. scale_slot: the A-scale group ring cursor (warp-uniform, across tiles).
template <class Layout, int kFormerGroups>
__device__ __forceinline__ void wide_fp8_tile_mainloop_tma_scales(float (&accumulator)[Layout::kBlockN / 2],
                                                                  float (&partial)[Layout::kBlockN / 2],
                                                                  const Fp8GemmShared<Layout>& smem, int k_blocks,
                                                                  uint32_t a_descriptor0, uint32_t b_descriptor0,
                                                                  int scale_row, int& stage, uint32_t& phase,
                                                                  int& scale_slot) {
  constexpr int kRegisters = Layout::kBlockN / 2;
  constexpr int kGroupKBlocks = Layout::kScaleGroupKBlocks;
  // [slot][row] float4 = the row's 4 k-blocks (16-byte aligned: ring 128-byte aligned, rows 16 bytes).
  const float4* const ring_row = reinterpret_cast<const float4*>(smem.a_tiles + Layout::kAScaleRingOffset) + scale_row;
#pragma unroll
  for (int i = 0; i < kRegisters; ++i) accumulator[i] = 0.0f;
#pragma unroll 1
  for (int group = 0; group < k_blocks / kGroupKBlocks; ++group) {
    float4 scales_a0, scales_a1;
    float4 scales_b0, scales_b1;  // kTmaBScales: the group's [block0, block0 + 1][4 k-blocks] B scales
#pragma unroll
    for (int j = 0; j < kGroupKBlocks; ++j) {
      barrier_wait(&smem.full[stage], phase);
      if (j == 0) {
        scales_a0 = ring_row[scale_slot * Layout::kBlockM];
        scales_a1 = ring_row[scale_slot * Layout::kBlockM + 8];
        if constexpr (Layout::kTmaBScales) {
          const float4* const b_slot = reinterpret_cast<const float4*>(smem.a_tiles + Layout::kBScaleRingOffset +
                                                                       scale_slot * Layout::kBScaleSlotBytes);
          scales_b0 = b_slot[0];
          scales_b1 = b_slot[1];
        }
        scale_slot = scale_slot + 1 == Layout::kAScaleGroups ? 0 : scale_slot + 1;
      }
      const float scale_a0 = float4_lane(scales_a0, j), scale_a1 = float4_lane(scales_a1, j);
      if constexpr (Layout::kTmaBScales) {
        wide_fp8_kblock<Layout, kFormerGroups>(accumulator, partial, smem, a_descriptor0, b_descriptor0, scale_a0,
                                              scale_a1, float4_lane(scales_b0, j), float4_lane(scales_b1, j), stage,
                                              phase);
      } else {
        const float* slot = smem.scales + stage * Layout::kScaleFloats + Layout::kBScaleIndex;
        const float scale_b0 = slot[0], scale_b1 = slot[1];
        wide_fp8_kblock<Layout, kFormerGroups>(accumulator, partial, smem, a_descriptor0, b_descriptor0, scale_a0,
                                              scale_a1, scale_b0, scale_b1, stage, phase);
      }
    }
  }
}

// ---- Clusters of 2 CTAs (MEGAMOE_GEMM_CLUSTER=1; docs/grouped_gemm.md "v11 clusters") ----
// Producer thread of one CTA of a cluster for one schedule unit (locate_cluster_tile): per k-block, after its
// `empty` wait (which completes only once the math warps of BOTH CTAs released the stage: `empty` counts 2 x 8
// arrivals), it expects its A chunks + the WHOLE B tile + the A-scale group box, then loads its A chunks (this CTA
// only) and the B tile in two kBBlockRows-row parts:
// - shared_b (a pair: both CTAs multiply the same B tile): only part cta_rank, multicast to both CTAs (the peer
//   loads the other part the same way; both complete bytes on both CTAs' `full`);
// - otherwise (a lone unit: each CTA its own n-tile): both parts, into this CTA only.
// and, kTmaScales, the A-scale box every 4th k-block. m0 / m_end: this CTA's tile rows; m_end <= m0: no tile (no
// A chunk, no scale box; the ring slot still advances, as the math side's; B still loaded: in a pair the peer's
// math needs this CTA's part, and the expected bytes stay those of every unit). b_row: the tile's first B row;
// b_rows: the B tensor's rows (num_experts x n): a part of the last expert's partial last n-tile that STARTS at or
// past b_rows is moved back to start at b_rows - kBBlockRows (its columns are >= n: computed, never stored), so no
// box lies wholly out of bounds; a part that starts inside stays (TMA zero-fills its rows past the end).
// NOTES:
// - The peer's bytes may complete on this CTA's `full` before this thread's arrive-expect of the same phase (the
//   tx-count goes negative meanwhile): the phase cannot complete early, because it still waits for this thread's
//   arrival, and the expect always exceeds the peer's kBBlockBytes (it includes this CTA's own B part).
// - They can never land in an earlier phase: the peer issues k-block j into stage s only after ITS `empty` wait,
//   which needs this CTA's math warps' releases of k-block j - kStages, given after their `full` wait of that
//   phase: so this CTA's `full[s]` has completed phase j - kStages and stands in phase j. Both CTAs walk the same
//   units with the same k_blocks, so their k-block sequences (and stage / phase cursors) are the same.
template <class Layout>
__device__ __forceinline__ void wide_produce_tile_cluster(const Fp8GemmShared<Layout>& smem, const CUtensorMap* a_map,
                                                          const CUtensorMap* b_map, const CUtensorMap* scale_map,
                                                          int m0, int m_end, int b_row, int b_rows, bool shared_b,
                                                          int cta_rank, int k_blocks,
                                                          PipelineCursor<Layout::kStageCount>& cursor,
                                                          int& scale_slot, const CUtensorMap* b_scale_map = nullptr,
                                                          int b_scale_row = 0) {
  static_assert(Layout::kClusterSize == 2 && Layout::kBlockM % kATrimRows == 0, "pairs; whole 64-row chunks");
  constexpr bool kTmaBScales = Layout::kTmaBScales;
  constexpr int kScaleBoxBytes = Layout::kAScaleGroupBytes + (kTmaBScales ? Layout::kBScaleBoxBytes : 0);
  constexpr int kChunkBytes = kATrimRows * kBlockK;
  constexpr uint16_t kAllCtas = (1u << Layout::kClusterSize) - 1;
  uint8_t* const ring = smem.a_tiles + Layout::kAScaleRingOffset;
  const int chunks = m_end > m0 ? min((m_end - m0 + kATrimRows - 1) / kATrimRows, Layout::kBlockM / kATrimRows) : 0;
  // Row of B part q (moved back inside the tensor only when it would start past it; see above).
  // NOTES: the same loads as cluster_load_b_tile (sm90_cluster_pipeline.cuh, the BF16 cluster kernel's); kept inline
  // here because calling the helper reschedules this producer (SASS +-4 instructions), and the FP8 kernels' code
  // stays as measured.
  const auto part_row = [&](int q) {
    const int row = b_row + q * Layout::kBBlockRows;
    return row < b_rows ? row : b_rows - Layout::kBBlockRows;
  };
  const int own_part_row = part_row(cta_rank);
  for (int kb = 0; kb < k_blocks; ++kb) {
    const bool group = Layout::kTmaScales && kb % Layout::kScaleGroupKBlocks == 0;
    const bool scale_box = group && chunks > 0;
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    barrier_arrive_expect_bytes(&smem.full[cursor.stage],
                                chunks * kChunkBytes + Layout::kBBytes + (scale_box ? kScaleBoxBytes : 0));
    uint8_t* a_stage = smem.a_tiles + cursor.stage * Layout::kABytes;
    for (int c = 0; c < chunks; ++c)
      tma_load_2d(a_stage + c * kChunkBytes, a_map, kb * kBlockK, m0 + c * kATrimRows, &smem.full[cursor.stage]);
    uint8_t* b_stage = smem.b_tiles + cursor.stage * Layout::kBBytes;
    if (shared_b) {
      tma_load_2d_multicast(b_stage + cta_rank * Layout::kBBlockBytes, b_map, kb * kBlockK, own_part_row,
                            &smem.full[cursor.stage], kAllCtas);
    } else {
      for (int q = 0; q < Layout::kClusterSize; ++q)
        tma_load_2d(b_stage + q * Layout::kBBlockBytes, b_map, kb * kBlockK, part_row(q), &smem.full[cursor.stage]);
    }
    if (group) {
      if (scale_box) {
        tma_load_2d(ring + scale_slot * Layout::kAScaleGroupBytes, scale_map, kb * 4, m0, &smem.full[cursor.stage]);
        if constexpr (kTmaBScales)
          tma_load_2d(smem.a_tiles + Layout::kBScaleRingOffset + scale_slot * Layout::kBScaleSlotBytes, b_scale_map,
                      kb * 4, b_scale_row, &smem.full[cursor.stage]);
      }
      scale_slot = scale_slot + 1 == Layout::kAScaleGroups ? 0 : scale_slot + 1;
    }
    cursor.advance();
  }
}

// Start of both v11 kernels (sm90_fp8_wide_grouped_gemm_kernel, sm90_fp8_wide_gemm1_kernel), one copy so that the
// two keep the same schedule and start protocol: wide_unit_walk, wide_start, (the caller's tile counts),
// wide_schedule. NOTES (all three): __forceinline__ and the same statements as the code they replace: the SASS of
// every v11 kernel is unchanged.
//
// wide_unit_walk: this CTA's walk over the schedule units: its rank in its pair (0 without clusters), its first
// unit and the stride (cluster index / count with kCluster, else block index / grid size).
// NOTES: uniform (broadcast from lane 0), so branches on them do not diverge; both CTAs of a cluster get the same
// first unit and stride (the kCluster NOTES of sm90_fp8_wide_grouped_gemm_kernel).
struct WideUnitWalk {
  int cta_rank, first_unit, unit_step;
};
template <bool kCluster>
__device__ __forceinline__ WideUnitWalk wide_unit_walk() {
  const int cta_rank = kCluster ? __shfl_sync(0xffffffffu, static_cast<int>(cluster_cta_rank()), 0) : 0;
  const int first_unit =
      kCluster ? __shfl_sync(0xffffffffu, static_cast<int>(cluster_index_x()), 0) : static_cast<int>(blockIdx.x);
  const int unit_step =
      kCluster ? __shfl_sync(0xffffffffu, static_cast<int>(cluster_count_x()), 0) : static_cast<int>(gridDim.x);
  return {cta_rank, first_unit, unit_step};
}

// wide_start: thread 0 initialises the stage barriers and prefetches the tensor maps (scale_map only with
// kTmaScales). NOTES: nothing may wait on or arrive at a barrier before wide_schedule's CTA / cluster barrier.
template <bool kTmaScales, class Layout>
__device__ __forceinline__ void wide_start(const Fp8GemmShared<Layout>& smem, const CUtensorMap* a_map,
                                           const CUtensorMap* b_map, const CUtensorMap* scale_map) {
  if (threadIdx.x == 0) {
    smem.init_barriers();
    prefetch_tensor_map(a_map);
    prefetch_tensor_map(b_map);
    if constexpr (kTmaScales) prefetch_tensor_map(scale_map);
  }
}

// wide_schedule: warp 1 builds the tile table, then a CTA (or, with kCluster, cluster) barrier; returns the
// schedule's units (uniform): tiles (n_tiles per m-tile) or, with kCluster, cluster units (the table counts them).
// NOTES: kCluster: the cluster barrier (all threads of both CTAs) also orders the peer's barrier initialisation
// (wide_start) before any multicast or remote arrival can reach it, and the tile table before its readers.
template <int kBlockM, bool kCluster>
__device__ __forceinline__ int wide_schedule(const ExpertTileTable& table, const GroupedGemmParams& params, int warp,
                                             int n_tiles) {
  if (warp == 1)
    build_expert_tile_table<kBlockM, kCluster>(table, params.expert_offsets, params.num_experts, params.m_capacity,
                                               n_tiles);
  if constexpr (kCluster) cluster_sync();  // the peer's barriers are initialised before anything reaches them
  else __syncthreads();
  return __shfl_sync(0xffffffffu, table.tile_prefix[params.num_experts], 0) * (kCluster ? 1 : n_tiles);
}

// One tile of the scale warp (warp 1) of both v11 kernels: the tile's two B block scale rows (first, second:
// k_blocks each) and, without kTmaScales, the A scales of rows [m0, m_end) (cp.async; with kTmaScales the TMA
// producer loads those). The kernels pick the two B blocks (GEMM 2: n0 / 128 and the next; GEMM 1: gate, up).
// NOTES: __forceinline__ and the same calls as the code it replaces: the kernels' SASS is unchanged.
template <bool kTmaScales, class Layout>
__device__ __forceinline__ void wide_produce_scales(const Fp8GemmShared<Layout>& smem, const float* a_scales,
                                                    const float* first, const float* second, int m0, int m_end,
                                                    int k_blocks, PipelineCursor<Layout::kStageCount>& cursor) {
  if constexpr (kTmaScales)
    wide_produce_b_scales(smem, first, second, k_blocks, cursor);
  else
    produce_fp8_scales(smem, a_scales, first, second, m0, m_end, k_blocks, cursor);
}

// One tile of the TMA producer thread (threadIdx.x == 0 of warpgroup 0) of both v11 kernels
// (sm90_fp8_wide_grouped_gemm_kernel, sm90_fp8_wide_gemm1_kernel): A rows [m0, m_end), B rows from b_row (of
// b_rows in all) and, with kTmaScales, A scales into the stage ring, by the cluster, TMA-scale or plain producer.
// One copy so that the two kernels keep the same choice and arguments.
// NOTES:
// - __forceinline__ and the same calls as the code it replaces: the SASS of every v11 kernel is unchanged. The
//   unit loop, locate_unit and the loop state (cursor, expert, scale_slot) stay in the kernels: moved in here
//   (tried), their values come out of register promotion in another order and ptxas renames and reschedules
//   part of the producer.
// - b_rows (= num_experts * n) is used by the cluster producer only (a B part never starts past it).
template <bool kTmaScales, bool kCluster, class Layout>
__device__ __forceinline__ void wide_produce_tile(const Fp8GemmShared<Layout>& smem, const CUtensorMap* a_map,
                                                  const CUtensorMap* b_map, const CUtensorMap* scale_map, int m0,
                                                  int m_end, int b_row, int b_rows, bool shared_b, int cta_rank,
                                                  int k_blocks, PipelineCursor<Layout::kStageCount>& cursor,
                                                  int& scale_slot, const CUtensorMap* b_scale_map = nullptr,
                                                  int b_scale_row = 0) {
  if constexpr (kCluster)
    wide_produce_tile_cluster(smem, a_map, b_map, scale_map, m0, m_end, b_row, b_rows, shared_b, cta_rank, k_blocks,
                              cursor, scale_slot, b_scale_map, b_scale_row);
  else if constexpr (kTmaScales)
    wide_produce_tile_tma_scales(smem, a_map, b_map, scale_map, m0, m_end, b_row, k_blocks, cursor, scale_slot,
                                 b_scale_map, b_scale_row);
  else
    produce_fp8_tile_trimmed(smem, a_map, b_map, m0, m_end, b_row, k_blocks, cursor);
}

// kTmaScales: A scales by TMA through scale_map (unused otherwise; NOTES above wide_produce_tile_tma_scales).
// kCluster: clusters of 2 CTAs sharing each B tile by multicast (launched with cluster dims (2, 1, 1)):
// NOTES (kCluster; docs/grouped_gemm.md "v11 clusters"):
// - Schedule (locate_cluster_tile; the tile table counts its units): both CTAs of a cluster take the same unit
//   (cluster index + k x clusters) with the same k_blocks, so their (unit, k-block) sequences and ring cursors are
//   the same. A unit is a pair (m-tiles 2p, 2p + 1 of one expert and n-tile: B shared by multicast) or, for an
//   expert's odd last m-tile, a lone unit (n-tiles 2j, 2j + 1 of that m-tile: each CTA loads its own B). A CTA
//   without a tile (CTA 1 of the last lone unit at odd n_tiles) loads B only, releases every stage unread (both
//   math warpgroups take the "none of this warpgroup's rows" path) and stores nothing.
// - `empty` of a stage counts the 8 math warps of BOTH CTAs (lane r of each math warp arrives on CTA r's,
//   wide_release_stage), because both producers write into both CTAs' stage (the B parts). Arrivals and waits keep
//   CTA-scope semantics (barrier_arrive_cluster's NOTES: what crosses CTAs is async-proxy reads then TMA writes).
//   `full` is unchanged (1 + 32 arrivals, A + whole B [+ scales] bytes).
// - Start: barriers are initialised, then a cluster barrier (arrive.release / wait.acquire, all threads of both
//   CTAs; it also orders the tile table) before any multicast or remote arrival can reach the peer.
// - Exit: every thread reaches a final cluster barrier (no early return), so no CTA exits while its peer may
//   still arrive on its `empty` barriers. The peer's multicast writes into this CTA have all completed by then:
//   this CTA's math warps waited on every `full` phase, which counts those bytes.
// - Outputs: per tile the same A rows, the same B image (two 8-row-atom-aligned halves), the same scales and
//   the same FFMA sequence as the 1-CTA kernel: bit-identical; only which CTA computes a tile changes.
//
// TMA B scales (kTmaBScales, MEGAMOE_FP8_V11_TMA_BSCALES, default on; with kTmaScales): b_scale_map views
// params.b_scales [num_experts x n / 128 rows][k / 128] fp32 (as bytes), boxes of 16 bytes x 2 rows: the tile's first
// block row (b_row / 128 = expert x n / 128 + n0 / 128) and the next, 4 k-blocks, loaded by the TMA producer with every
// A-scale group box and read by the math warps at the group's first k-block (wide_fp8_tile_mainloop_tma_scales). No
// scale warp; `full` takes 1 arrival (Layout::kScalesInShared = false).
// NOTES:
// - The second row is block0 + 1, where the scale warp reads wide_second_block(n0, n): they differ only on a tile
//   whose first block is the expert's last (block0 + 1 = n / 128; the box then reads the next expert's first block,
//   or zeros past the tensor), and there every column after block0's is >= n: computed, never stored. Stored
//   outputs get the same floats in the same products: bit-identical to kTmaBScales = false.
// - Ring reuse as sm90_fp8_wide_gemm1_kernel's "TMA B scales" NOTES (the B slot is the A-scale group slot's twin).
template <int kBlockN, bool kTmaScales, bool kCluster = false, bool kTmaBScales = false>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_fp8_wide_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                      const __grid_constant__ CUtensorMap b_map,
                                      const __grid_constant__ CUtensorMap scale_map,
                                      const __grid_constant__ CUtensorMap out_map,
                                      const __grid_constant__ CUtensorMap b_scale_map, const GroupedGemmParams params) {
  using Layout = WideFp8Layout<kBlockN, kTmaScales, kCluster ? 2 : 1, kTmaBScales>;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kStages = Layout::kStageCount;
  constexpr int kClusterSize = Layout::kClusterSize;

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
  const int n_tiles = (params.n + kBlockN - 1) / kBlockN;
  const int n_blocks = params.n / 128;
  const int total_units = wide_schedule<kBlockM, kCluster>(table, params, warp, n_tiles);

  // Register split as sm90_fp8_grouped_gemm_kernel (its NOTES: the pool is 168 x 384; 24 + 2 x 240 = 504).
  // kCluster: 40 + 2 x 232 = 504: the cluster producer spilled at 24 (ptxas: 28-40 bytes, in the producer and
  // scale warps' tile loops); the math warpgroups need no more than 232 (ptxas: 0 spills).
  constexpr uint32_t kProducerRegs = kCluster ? 40 : 24;
  constexpr uint32_t kMathRegs = kCluster ? 232 : 240;
  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    if (warp == 1 && !kTmaBScales) {  // the scale warp: A scales of the tile's rows, the tile's two B block scales
      PipelineCursor<kStages> cursor;
      int expert = 0;
      for (int unit = first_unit; unit < total_units; unit += unit_step) {
        const ClusterTileCoordinates where =
            locate_unit<kCluster>(table, unit, n_tiles, kBlockM, cta_rank, expert, params.m_fastest);
        const int block0 = where.n_tile * kBlockN / 128;
        const int block1 = wide_second_block(where.n_tile * kBlockN, params.n);
        const float* expert_scales = params.b_scales + static_cast<int64_t>(expert) * n_blocks * k_blocks;
        wide_produce_scales<kTmaScales>(smem, params.a_scales, expert_scales + static_cast<int64_t>(block0) * k_blocks,
                                        expert_scales + static_cast<int64_t>(block1) * k_blocks, where.m0,
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
    const int scale_row = math_wg * 64 + warp_in_wg * 16 + lane / 4;  // A-scale slot of fragment row 0
    // Descriptor words of stage 0 (uniform: from the broadcast warpgroup index and the shared base).
    const uint32_t a_descriptor0 = __shfl_sync(
        0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.a_tiles + math_wg * 64 * kBlockK)), 0);
    const uint32_t b_descriptor0 =
        __shfl_sync(0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.b_tiles)), 0);
    uint8_t* const warp_staging = smem.bf16_staging + (math_wg * 4 + warp_in_wg) * Layout::kStagingBytesPerWarp;
    __nv_bfloat16* const out = static_cast<__nv_bfloat16*>(params.out);
    if (threadIdx.x % 128 == 0) prefetch_tensor_map(&out_map);

    int stage = 0;
    uint32_t phase = 0;
    int scale_slot = 0;  // kTmaScales: A-scale group ring cursor
    int expert = 0;
    float accumulator[kBlockN / 2];
    float partial[kBlockN / 2];
    for (int unit = first_unit; unit < total_units; unit += unit_step) {
      const ClusterTileCoordinates t =
          locate_unit<kCluster>(table, unit, n_tiles, kBlockM, cta_rank, expert, params.m_fastest);
      const int m0 = __shfl_sync(0xffffffffu, t.m0, 0);
      const int m_end = __shfl_sync(0xffffffffu, t.m_end, 0);
      const int n0 = __shfl_sync(0xffffffffu, t.n_tile, 0) * kBlockN;
      expert = __shfl_sync(0xffffffffu, expert, 0);
      // None of this warpgroup's rows (kCluster: also a CTA without a tile, m_end <= m0): release every stage unread.
      if (m_end - m0 <= 64 * math_wg) {
#pragma unroll 1
        for (int kb = 0; kb < k_blocks; ++kb) {
          barrier_wait(&smem.full[stage], phase);
          wide_release_stage<kClusterSize>(&smem.empty[stage]);
          stage = stage + 1 == kStages ? 0 : stage + 1;
          phase ^= stage == 0 ? 1u : 0u;
        }
        // kTmaScales: the tile's k_blocks / 4 groups pass unread (the producer's slot advances as many).
        if constexpr (kTmaScales)
          scale_slot = (scale_slot + k_blocks / Layout::kScaleGroupKBlocks) % Layout::kAScaleGroups;
        continue;
      }
      static_assert(wide_former_groups(128, 0) == 16 && wide_former_groups(192, 0) == 16 &&
                        wide_former_groups(192, 192) == 8 && wide_former_groups(192, 384) == 16,
                    "192 t starts 0 or 64 columns into a block: 16 or 8 groups of 8 columns in the first");
      if constexpr (kTmaScales) {
        if (kBlockN == 128 || wide_former_groups(kBlockN, n0) == 16)
          wide_fp8_tile_mainloop_tma_scales<Layout, 16>(accumulator, partial, smem, k_blocks, a_descriptor0,
                                                        b_descriptor0, scale_row, stage, phase, scale_slot);
        else
          wide_fp8_tile_mainloop_tma_scales<Layout, 8>(accumulator, partial, smem, k_blocks, a_descriptor0,
                                                       b_descriptor0, scale_row, stage, phase, scale_slot);
      } else if constexpr (kBlockN == 128) {
        wide_fp8_tile_mainloop<Layout, 16>(accumulator, partial, smem, k_blocks, a_descriptor0, b_descriptor0,
                                           scale_row, stage, phase);
      } else {  // n0 = 192 t: the first scale block covers 128 (t even) or 64 (t odd) of the tile's columns
        if (wide_former_groups(kBlockN, n0) == 16)
          wide_fp8_tile_mainloop<Layout, 16>(accumulator, partial, smem, k_blocks, a_descriptor0, b_descriptor0,
                                             scale_row, stage, phase);
        else
          wide_fp8_tile_mainloop<Layout, 8>(accumulator, partial, smem, k_blocks, a_descriptor0, b_descriptor0,
                                            scale_row, stage, phase);
      }
      store_bf16_epilogue_tma<kBlockN, Layout::kStagingRowsPerWarp>(accumulator, warp_staging,
                                                                    m0 + math_wg * 64 + warp_in_wg * 16, m_end,
                                                                    &out_map, out, n0, params.n);
    }
    bulk_wait_all();
  }
  // kCluster: no CTA leaves while its peer may still arrive on its barriers (NOTES above).
  if constexpr (kCluster) cluster_sync();
}

}  // namespace megamoe::kernels::sm90

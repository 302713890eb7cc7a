// W4A8 v9 (docs/grouped_gemm.md "W4A8 v9"): a 256 x 128 tile with M-split math warpgroups for the BF16-out
// W4A8 GEMMs (GEMM 2 / plain) at large M, sm_90a. The numbers, the decode and the producer pieces are those of
// sm90_w4a8_grouped_gemm.cuh.
//
// Why: the 128 x 256 split-N kernel decodes its whole 256 x 128 weight tile for every 128-row m-tile, so at
// >= 1024 rows per expert the decode (ALU, STS of the decoded tile, proxy fence, barrier) is paid once per 128
// rows. Here the tile is 256 rows (A) x 128 weight rows (N): math warpgroup 0 owns tile rows 0-127, warpgroup 1
// rows 128-255, and BOTH multiply by the same decoded 128 x 128 B tile, so each k-block decodes 128 x 128 weights
// for 256 rows: half the decode per FLOP. Per math warpgroup the register shape is the 128-row kernel's (two m64
// sub-tiles x n128 accumulators + one 64-register partial).
//
// CTA = 3 warpgroups. Warpgroup 0 as the standalone kernel (run_w4a8_producer_warpgroup: thread 0 streams the A
// tile [256, 128 B] (TMA, 128-byte swizzle), the FP4 tile [128, 64 B] (TMA, 64-byte swizzle) and the tile's group
// scales (one bulk copy); warp 1, the scale warp, copies the 256 A scales and the tile's ONE block record {factor,
// p}). A 128-row N tile is exactly one 128 x 128 weight block of the packed layout per k-block, so the layout and
// the numerics are unchanged. The 256 math threads decode the 128 x 128 tile, two threads per weight row (64 K
// each: decode_fp4_half_row_select, as the small-M kernel), into a double-buffered decoded tile shared by both
// math warpgroups; the decode barrier is CTA-wide over the 256 math threads. Per k-block (each math warpgroup):
//   bar.sync 256 (decoded kb visible) -> wgmma sub-tile 0 (async) -> decode kb+1 into the other buffer
//   (overlaps the tensor cores) -> wait -> promote -> wgmma sub-tile 1 -> wait -> release stage -> promote.
// Epilogue: w4a8_store_bf16_epilogue (direct BF16 stores of the warpgroup's 128 rows x 128 columns).
//
// NOTES:
// - Shared memory (kStages = 4, kMaxExperts = 1024 -> tile table 12,300 B; limit 227 KiB = 232,448 B), in bytes:
//     decoded tiles 2 x 16,384 = 32,768 | A 4 x 32,768 = 131,072 | FP4 4 x 8,192 = 32,768 | group scales 4 x 1,024
//     (NVFP4; MXFP4 4 x 512) | scale ring 4 x 258 words = 4,128 | mbarriers 64 | table 12,300 | alignment 1,024:
//     218,220 (NVFP4), 216,172 (MXFP4). A fifth stage (+42,016 / 41,504) does not fit (launcher: max_stages).
//     No BF16 staging: the epilogue stores from registers, as the standalone 128 x 256 kernel does.
// - The decoded buffer written at k-block kb+1 was last read by the wgmmas of kb-1 of BOTH math warpgroups; every
//   math thread waited for its own (wgmma_wait<0>) before arriving at the CTA-wide barrier of kb, so after that
//   barrier no wgmma still reads it. At a tile's start the same barrier orders the previous tile's wgmmas before
//   the first decode into buffer 0.
// - Generic st.shared of the decode are made visible to the wgmma (async proxy) by fence.proxy.async before the
//   barrier (each thread fences its own stores).
// - Producer, scale warp and math warpgroups iterate the identical (tile, k-block) sequence, so stage index and
//   phase stay in lockstep; `empty` takes lane 0 of each of the 8 math warps (kEmptyArrivals).
// - A math warpgroup whose 64-row sub-tile holds no row of the expert (warpgroup-uniform: active_sub_tiles) skips
//   that sub-tile's wgmma and promotion; it still decodes its half of the weight rows and arrives at every
//   barrier. An expert with <= 128 rows leaves warpgroup 1 all past the end: it only decodes. Rows past the
//   expert's end are never stored.
// - Bit-identical to the 128 x 256 kernel's BF16 output: the same wgmma m64n128k32 on the same A rows and the same
//   decoded bytes of the same 128 columns, the same promotion fl(a_scale * factor) in the same k-block order.
#pragma once

#include "kernels/sm90_w4a8_grouped_gemm.cuh"

namespace megamoe::kernels::sm90 {

constexpr int kW4a8MSplitBlockM = 256;
constexpr int kW4a8MSplitBlockN = 128;
constexpr int kW4a8MSplitSubTiles = 2;  // 64-row sub-tiles per math warpgroup
// The CTA-wide decode barrier of the 256 math threads (the standalone kernels' id 2 = kW4a8DecodeBarrier).
constexpr uint32_t kW4a8MSplitDecodeBarrier = kW4a8DecodeBarrier;

// The names W4a8GemmShared, produce_w4a8_tile, produce_w4a8_scales and run_w4a8_producer_warpgroup read (as
// W4a8GemmLayout), for a kBlockM x 128 tile whose ONE decoded 128 x 128 B tile (double-buffered) both math
// warpgroups read: v9 (256 x 128, M-split, no staging) and v10 (128 x 128, sm90_w4a8_v10_grouped_gemm.cuh, with
// the BF16 staging rows of wide_bf16_epilogue: kStagingRowsPerWarp rows of kStagingPitch bytes per math warp, at
// kExchangeOffset = W4a8GemmShared::bf16_staging). kHandoffBarrierCount: further mbarriers after the ring's (v10's
// mbarrier handoff: decoded[2], consumed[2] at full + 2 kStages). With kStagingRowsPerWarp = 0 and no handoff
// barriers the offsets are v9's as before.
template <int kBlockMValue, int kStages, Fp4Format kFormat, int kStagingRowsPerWarpValue, int kHandoffBarrierCount = 0>
struct W4a8SharedDecodeLayout {
  static constexpr int kSubTiles = kBlockMValue / (64 * kMathWarpgroups);  // 64-row sub-tiles per math warpgroup
  static constexpr int kStageCount = kStages;
  static constexpr int kBlockN = 128;
  static constexpr bool kScalesInShared = false;
  static constexpr bool kW4a8SharedScales = true;
  static constexpr Fp4Format kFp4Format = kFormat;
  static constexpr int kBlockM = kBlockMValue;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kFp4Bytes = kBlockN * kW4a8Fp4RowBytes;
  static constexpr int kScaleBytes = kBlockN * Fp4Traits<kFormat>::kScaleBytesPerRow;
  static constexpr int kDecodedBytes = kBlockN * kBlockK;  // the one FP8 B tile both math warpgroups read
  static constexpr int kDecodedOffset = 0;
  static constexpr int kAOffset = kDecodedOffset + 2 * kDecodedBytes;
  static constexpr int kFp4Offset = kAOffset + kStages * kABytes;
  static constexpr int kScaleOffset = kFp4Offset + kStages * kFp4Bytes;
  static constexpr int kExchangeOffset = kScaleOffset + kStages * kScaleBytes;  // BF16 staging (v10), no exchange
  // BF16 staging of wide_bf16_epilogue (v10): row pitch kBlockN BF16 + 16 B (words = 4 mod 32, WideFp8Layout's).
  static constexpr int kStagingRowsPerWarp = kStagingRowsPerWarpValue;
  static constexpr int kStagingPitch = kBlockN * 2 + 16;
  static constexpr int kStagingBytes = kMathWarpgroups * 4 * kStagingRowsPerWarp * kStagingPitch;
  // Scale ring: per stage kBlockM A scales (0 past the expert's end), then the tile's {factor, p} at [kBlockM].
  static constexpr int kScaleRecords = kBlockN / 128;
  static constexpr int kScaleSlotWords = kBlockM + 2 * kScaleRecords;
  static constexpr int kEmptyArrivals = kMathWarpgroups * 4;  // lane 0 of every math warp
  static constexpr int kScaleRingOffset = kExchangeOffset + kStagingBytes;
  static constexpr int kScaleRingBytes = (kStages * kScaleSlotWords * 4 + 15) / 16 * 16;
  static constexpr int kBarrierOffset = kScaleRingOffset + kScaleRingBytes;
  static constexpr int kHandoffBarriers = kHandoffBarrierCount;
  static constexpr int kTableOffset = kBarrierOffset + (2 * kStages + kHandoffBarriers) * 8;
  static constexpr int shared_bytes(int num_experts) {
    return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts);
  }
  static_assert(kScaleRecords == 1, "one 128 x 128 weight block per tile and k-block");
  static_assert(kBlockM % (64 * kMathWarpgroups) == 0, "whole 64-row sub-tiles per math warpgroup");
  static_assert(kABytes % 1024 == 0 && kFp4Bytes % 1024 == 0 && kDecodedBytes % 1024 == 0 && kScaleBytes % 16 == 0,
                "stage alignment");
  static_assert(kExchangeOffset % 16 == 0 && kStagingPitch % 16 == 0, "bulk copies read 16-byte aligned staging rows");
};

// v9's layout: 256 x 128, no staging.
template <int kStages, Fp4Format kFormat>
using W4a8MSplitLayout = W4a8SharedDecodeLayout<kW4a8MSplitBlockM, kStages, kFormat, 0>;
static_assert(W4a8MSplitLayout<4, Fp4Format::kNvfp4>::kSubTiles == kW4a8MSplitSubTiles, "v9: two sub-tiles");

// Math warpgroup `math_wg` (tile rows 128 math_wg ..), one tile: decode (its half of the shared 128 x 128 weight
// tile) + wgmma + promotion over k_blocks, in the order of the header comment. where: the warpgroup's rows
// (MathRows of its first row); active_sub_tiles: its 64-row sub-tiles holding a row of the expert (0..2).
template <class Layout>
__device__ __forceinline__ void w4a8_m_split_mainloop(float (&accumulator)[kW4a8MSplitSubTiles][64],
                                                      float (&partial)[64], const W4a8GemmShared<Layout>& smem,
                                                      const MathRows<kW4a8MSplitSubTiles>& where, int active_sub_tiles,
                                                      int k_blocks, int math_wg,
                                                      PipelineCursor<Layout::kStageCount>& cursor, int decoder) {
  constexpr int kSubTilesM = kW4a8MSplitSubTiles;
  constexpr int kStages = Layout::kStageCount;
  const int lane = threadIdx.x % 32;
  const int math_thread = threadIdx.x - 128;  // 0..255 over both math warpgroups
  const int row_in_wg = ((threadIdx.x % 128) / 32) * 16 + lane / 4;  // MathRows' row of register pair 0
  const int scale_row = 128 * math_wg + row_in_wg;                   // its A scale in the stage's slot
  auto slot_word = [&](int stage, int word) { return smem.scale_ring[stage * Layout::kScaleSlotWords + word]; };
  bool warp_has_rows[kSubTilesM];
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
    warp_has_rows[s] = __any_sync(0xffffffffu, where.valid[s][0] || where.valid[s][1]);
  // Two threads per weight row: math thread t decodes logical chunks 2 (t & 1), +1 of row t / 2.
  auto decode = [&](int s, int kb) {
    decode_fp4_half_row_select<Layout::kFp4Format>(
        decoder, smem.fp4_tiles + s * Layout::kFp4Bytes, smem.scale_tiles + s * Layout::kScaleBytes,
        smem.decoded + (kb & 1) * Layout::kDecodedBytes, math_thread / 2, 2 * (math_thread & 1),
        static_cast<int>(slot_word(s, Layout::kBlockM + 1)));
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  };
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int i = 0; i < 64; ++i) accumulator[s][i] = 0.0f;
  // Both math warpgroups have retired the previous tile's wgmmas before any thread overwrites buffer 0.
  named_barrier_sync(kW4a8MSplitDecodeBarrier, 256);
  barrier_wait(&smem.full[cursor.stage], cursor.phase);
  decode(cursor.stage, 0);
  for (int kb = 0; kb < k_blocks; ++kb) {
    // Stage kb's `full` was waited for before its decode: its scale slot is readable.
    const float factor = __uint_as_float(slot_word(cursor.stage, Layout::kBlockM));
    float scale_a[kSubTilesM][2];
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) scale_a[s][h] = __uint_as_float(slot_word(cursor.stage, scale_row + 64 * s + 8 * h));
    named_barrier_sync(kW4a8MSplitDecodeBarrier, 256);  // every row of decoded kb is written and fenced
    const uint32_t b_base = smem_address(smem.decoded + (kb & 1) * Layout::kDecodedBytes);
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s) {
      const bool active = s < active_sub_tiles;  // warpgroup-uniform
      if (active) {
        const uint32_t a_base =
            smem_address(smem.a_tiles + cursor.stage * Layout::kABytes + (128 * math_wg + 64 * s) * kBlockK);
        w4a8_issue_wgmma_m64n128(partial, a_base, b_base);
      }
      if (s == 0 && kb + 1 < k_blocks) {  // decode the next k-block while the tensor cores run
        const int next_stage = cursor.stage + 1 == kStages ? 0 : cursor.stage + 1;
        barrier_wait(&smem.full[next_stage], next_stage == 0 ? cursor.phase ^ 1 : cursor.phase);
        decode(next_stage, kb + 1);
      }
      if (active) {
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
      }
      if (s == kSubTilesM - 1) {
        if (lane == 0) barrier_arrive(&smem.empty[cursor.stage]);
        cursor.advance();
      }
      if (active && warp_has_rows[s])
        w4a8_promote_m64n128(accumulator[s], partial, scale_a[s][0] * factor, scale_a[s][1] * factor);
    }
  }
}

template <int kStages, Fp4Format kFormat>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_w4a8_m_split_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                          const __grid_constant__ CUtensorMap b_map, const W4a8GemmParams params) {
  using Layout = W4a8MSplitLayout<kStages, kFormat>;
  constexpr int kBlockM = Layout::kBlockM;
  // As the 128-row standalone kernel (its comment): 24 (producer thread, scale warp) / 240 (math).
  constexpr uint32_t kProducerRegs = 24;
  constexpr uint32_t kMathRegs = 240;
  static_assert(kProducerRegs + kMathWarpgroups * kMathRegs <= 504, "the launch's 168 x 384 registers");

  extern __shared__ uint8_t shared_raw[];
  const W4a8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);

  const int warpgroup = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  start_w4a8_kernel(smem, table, &a_map, &b_map, params);

  const int k_blocks = params.k / kBlockK;
  const int n_tiles = params.n / Layout::kBlockN;
  const int total_tiles = table.tile_prefix[params.num_experts] * n_tiles;
  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    run_w4a8_producer_warpgroup(smem, table, &a_map, &b_map, params, total_tiles, n_tiles, k_blocks);
    return;
  }

  registers_increase<kMathRegs>();
  const int math_wg = warpgroup - 1;  // = which 128-row half of the tile
  const int row_in_wg = ((threadIdx.x % 128) / 32) * 16 + lane / 4;
  PipelineCursor<kStages> cursor;
  int expert = 0;
  float accumulator[kW4a8MSplitSubTiles][64];
  float partial[64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile(table, tile, n_tiles, kBlockM, expert);
    const MathRows<kW4a8MSplitSubTiles> where(t.m0 + 128 * math_wg, t.m_end, row_in_wg);
    const int active = active_sub_tiles(t.m_end - t.m0, 128 * math_wg, kW4a8MSplitSubTiles);
    w4a8_m_split_mainloop<Layout>(accumulator, partial, smem, where, active, k_blocks, math_wg, cursor,
                                  params.decoder);
    w4a8_store_bf16_epilogue<kW4a8MSplitSubTiles>(accumulator, where, static_cast<__nv_bfloat16*>(params.out),
                                                  params.n, t.n_tile * Layout::kBlockN);
  }
}

}  // namespace megamoe::kernels::sm90

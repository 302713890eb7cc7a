// W4A8 v10 GEMM 1 (docs/grouped_gemm.md "W4A8 v10 GEMM 1"): the W4A8 v10 skeleton (sm90_w4a8_v10_grouped_gemm.cuh:
// v11's uniform mainloop + a CTA-shared decoded tile) applied to GEMM 1 the way FP8 v11 GEMM 1
// (sm90_fp8_wide_gemm1.cuh) applies v11 to it: split-M 128 x 256 tiles on W13 packed gate/up interleaved by 8
// (GemmRole::kGateUpInterleaved8, pack_w4a8_expert_weights), the in-thread SwiGLU + FP8 requant epilogue
// swiglu_quant_fp8_rows_epilogue (sm90_fp8_grouped_gemm.cuh, kHalves = 2) reused as is, in its kTmaStore form (v11
// GEMM 1's: TMA tensor stores of whole 16-row warps through out_map; docs/grouped_gemm.md "W4A8 v10 GEMM 1
// TMA-store epilogue"). grouped_gemm1_w4a8 runs it
// for W13 packed with kGateUpInterleaved8 at unknown or > 64 rows hints (1..64: the small-M kernel's kInterleaved8
// mode, sm90_w4a8_small_m_grouped_gemm.cuh, the other W4A8 kernel that reads that packing); which packing
// a loader picks is MEGAMOE_W4A8_G1_V10 (kernels::w4a8_gemm1_packing(), default 1 = this packing; 0 = kGateUp).
//
// Why: GEMM 1 at >= 512 rows per expert runs the old 128 x 256 split-N kernel (two m64 sub-tiles per math
// warpgroup, per-thread descriptors, the gate-exchange epilogue with pair barriers and 2-byte stores) at 562-637
// TFLOP/s while W4A8 v10 GEMM 2 reaches 690-724.
//
// CTA = 3 warpgroups, 384 threads, persistent. Warpgroup 0 = run_w4a8_producer_warpgroup unchanged, with
// Layout::kBlockN = 256 (thread 0: A [128 rows, 128 B] TMA 128-byte swizzle, FP4 [256 rows, 64 B] TMA 64-byte
// swizzle, the tile's group scales by one bulk copy; warp 1: the 128 A scales + the tile's TWO {factor, p} records
// per stage: [kBlockM + 0, 1] = gate block 2 n_tile, [kBlockM + 2, 3] = up block 2 n_tile + 1). Math warpgroup g:
// tile rows 64 g .. 64 g + 63, ALL 256 packed columns (accumulator[2][64]: n-half h = packed columns 128 h ..).
// Per k-block (running count j, decoded buffer j & 1):
//   bar.sync 256 (decoded j visible) -> 4 wgmma (A, B = decoded rows 0..127) + commit -> wait `full` of j+1,
//   decode the first half (K 0..63) of j+1's rows -> wait 0 -> promote h = 0 -> 4 wgmma (B rows 128..255) +
//   commit -> decode the second half (K 64..127) of j+1 -> wait 0 -> release the stage -> promote h = 1.
// The decode of the 256 x 128 FP4 tile: math thread t (0..255 over both warpgroups) decodes packed weight row t
// (its gate / up record by (t / 8) % 2: the interleave), 64 K under each wgmma group (decode_fp4_half_row_select
// with chunks 0-1, then 2-3), into a double-buffered 256 x 128 B decoded tile (2 x 32 KiB) both warpgroups read.
//
// NOTES:
// - Bit-identical to the old kernel's GEMM 1 (sm90_w4a8_grouped_gemm_kernel, kSwigluQuantFp8, on kGateUp
//   weights): (a) the decoded bytes: the packing moves rows (data, group scales) without changing them and keeps
//   the block records of the canonical 128-row gate / up blocks (2 j = gate block j, 2 j + 1 = up block j, as
//   kGateUp); a row decodes with its own block's p, whichever decoder (old / v7 / v8 give the same bytes). (b) The
//   partials: an element's 128-K partial is the same 4 wgmma m64n128k32 k-steps over the same A row and decoded B
//   row (it does not depend on the column position in the n128 group, the A row offset or the warpgroup issuing
//   it: sm90_fp8_wide_gemm1.cuh's argument). (c) The promotion: acc += partial * fl(a_scale * factor) with the
//   factor of the element's block, in k-block order from 0, as w4a8_promote_m64n128 (scale0 = scale_a0 * factor).
//   (d) The epilogue: swiglu_quant_fp8_rows_epilogue's per-element operations are w4a8_swiglu_quant_fp8_epilogue's
//   (activate(gate, up), amax over the row's 128 outputs (exact max), __fdiv_rn(fmaxf(__fmul_rn(amax, |w|),
//   1e-10), 448), __fmul_rn(h, w) / scale -> e4m3 satfinite; the division as quotient_by_reciprocal since session
//   22, exact_quotient.h: the same codes as __fdiv_rn).
// - Interleave: packed row 128 h + 16 p + c (c < 8) = gate row 64 h + 8 p + c of the tile's gate block, + 8 = the
//   up row; in the m64n128 fragment register 4 j + 2 r + c the column group j is even for gate, odd for up
//   (promotion scale by j % 2; the epilogue pairs accumulator[h][8 p + 2 r + c] with [8 p + 4 + 2 r + c]).
// - Handoff and buffer reuse as v10 (its NOTES): decoded buffer b written for k-block j + 1 was last read by both
//   groups of j - 1 in both warpgroups, which every thread waited for (wgmma_wait<0> after group h = 1) before
//   the barrier of j; the parity runs across tiles, so no tile-start barrier. Every thread fences its st.shared
//   (fence.proxy.async) after each decode half, before the next barrier.
// - Stage release: after group h = 1's wait (A of the stage read by both groups; its FP4 / group-scale bytes were
//   decoded before the barrier of its k-block; its scale slot read into registers before the first group).
// - A math warpgroup whose 64 rows hold no row of the expert runs its k loop unchanged (the other warpgroup reads
//   its half of the decoded rows; skipping the wgmma under a branch serializes them: v10 NOTES) and skips only
//   the epilogue. No other barrier: the epilogue (no AmaxCombine) synchronizes nothing.
// - Epilogue stores (docs/grouped_gemm.md "W4A8 v10 GEMM 1 TMA-store epilogue"): swiglu_quant_fp8_rows_epilogue with
//   kTmaStore, as v11 GEMM 1: a warp whose 16 rows are all the expert's writes them as one 16 x 128 B box (128-byte
//   swizzle) at (warp - 4) * 2048 of the staging and lane 0 stores it with ONE TMA tensor store (out_map: out E4M3
//   [m_capacity][n / 2] as bytes, boxes 128 B x kOutMapRows = 16 rows, launch_v10_gemm1); the warp holding the
//   expert's last rows (and only it) keeps the per-row 1-D bulk copies, from the same 2,048 B as 16 unswizzled
//   128-byte rows. Staging reuse / ordering, clipping and bit-identity: the kTmaStore NOTES of
//   swiglu_quant_fp8_rows_epilogue (codes and out_scales unchanged; only the store path differs). Lane 0 of every
//   math warpgroup prefetches out_map; every thread runs bulk_wait_all() before exiting.
// - Uniformity as v10: warpgroup / warp / per-tile values are __shfl_sync broadcasts; stage, phase, count and the
//   descriptor words (stage-0 base + stage * (bytes >> 4)) are warp-uniform.
// - Shared memory (1024 experts, limit 227 KiB = 232,448 B), bytes: decoded 2 x 32,768 = 65,536 | A 3 x 16,384 =
//   49,152 | FP4 3 x 16,384 = 49,152 | group scales 3 x 2,048 (NVFP4; MXFP4 3 x 1,024) | FP8 row staging 8 warps x
//   2,048 (kFp8TmaStagingBytesPerWarp) = 16,384, 1024-aligned for the TMA-store boxes (the offset already is:
//   65,536 + 3 x (16,384 + 16,384 + 2,048 or 1,024) is a multiple of 1,024, at any stage count, so the alignment
//   adds no bytes) | scale ring 3 x 132 words = 1,584 | mbarriers 48 | table 12,300 | alignment 1,024: 201,324
//   (NVFP4), 198,252 (MXFP4) (the per-row form's 144-byte pitch took 18,432: 2,048 more). A 4th stage (+35,360 /
//   +34,336 with its ring slot and barriers) still does not fit (236,684 / 232,588 B > 232,448); the launcher's
//   max_stages gives 3 (static_assert kW4a8V10Gemm1Stages).
#pragma once

#include "kernels/sm90_fp8_grouped_gemm.cuh"
#include "kernels/sm90_w4a8_grouped_gemm.cuh"
#include "kernels/sm90_w4a8_v10_grouped_gemm.cuh"

namespace megamoe::kernels::sm90 {

constexpr int kW4a8V10Gemm1BlockN = 256;  // packed gate/up columns: 128 outputs
constexpr int kW4a8V10Gemm1Stages = 3;
// The CTA-wide decode barrier of the 256 math threads (as v10's).
constexpr uint32_t kW4a8V10Gemm1DecodeBarrier = kW4a8DecodeBarrier;

// The v10 layout (W4a8V10LayoutBase) for the 128 x 256 GEMM-1 tile: ONE decoded 256 x 128 B tile (double-buffered)
// both math warpgroups read, and the FP8 row staging of swiglu_quant_fp8_rows_epilogue<..., kTmaStore> (math warp v
// at v * kFp8TmaStagingBytesPerWarp: one 1024-aligned 16 x 128 B box of out_map) at kExchangeOffset
// (W4a8GemmShared::bf16_staging).
// The scale ring slot holds the gate record {factor, p} at [kBlockM], the up record at [kBlockM + 2].
template <int kStages, Fp4Format kFormat>
struct W4a8V10Gemm1Layout
    : W4a8V10LayoutBase<kStages, kFormat, kW4a8V10Gemm1BlockN, kMathWarpgroups * 4 * kFp8TmaStagingBytesPerWarp, 1024> {
  // out_map's box rows (launch_v10_gemm1): one math warp's 16 rows.
  static constexpr int kOutMapRows = 16;
  static_assert(W4a8V10Gemm1Layout::kExchangeOffset % 1024 == 0, "TMA-store boxes: 128-byte swizzle atoms");
  static constexpr int kGateRecordWord = W4a8V10Gemm1Layout::kBlockM;
  static constexpr int kUpRecordWord = W4a8V10Gemm1Layout::kBlockM + 2;
  static_assert(W4a8V10Gemm1Layout::kScaleRecords == 2, "the tile's gate block and up block per k-block");
  static_assert(W4a8V10Gemm1Layout::kBlockN == 2 * 128 && W4a8V10Gemm1Layout::kBlockN == 128 * kMathWarpgroups,
                "one decoded weight row per math thread");
};

// One tile of math warpgroup `math_wg` (zeroes `accumulator`): per k-block the decode of packed weight row
// math_thread (two halves, one under each wgmma group) + two wgmma groups (n-halves) into `partial`, each waited
// for and promoted, in the order of the header comment. scale_row: this thread's first fragment row in the tile (its
// second is + 8). a_descriptor0 / b_descriptor0: descriptor start-address words of this warpgroup's A rows in stage
// 0 and of decoded buffer 0 (uniform). stage / phase: the ring cursor; count: the CTA-running k-block count
// (uniform, carried across tiles): k-block j uses decoded buffer j & 1.
template <class Layout>
__device__ __forceinline__ void w4a8_v10_gemm1_tile_mainloop(float (&accumulator)[2][64], float (&partial)[64],
                                                             const W4a8GemmShared<Layout>& smem, int k_blocks,
                                                             int math_thread, int scale_row, uint32_t a_descriptor0,
                                                             uint32_t b_descriptor0, int& stage, uint32_t& phase,
                                                             uint32_t& count, int decoder) {
  constexpr int kStages = Layout::kStageCount;
  constexpr int kSlotWords = Layout::kScaleSlotWords;
  const int lane = threadIdx.x % 32;
  const uint32_t* const ring = smem.scale_ring;
  // Packed row math_thread is a gate row for even 8-row groups, an up row for odd ones (the interleave).
  const int my_record_word = (math_thread / 8) % 2 == 0 ? Layout::kGateRecordWord : Layout::kUpRecordWord;
  // Half `part` (logical chunks 2 part, 2 part + 1: K 64 part .. + 63) of packed row math_thread of the stage's FP4
  // tile into decoded buffer j & 1, fenced for the wgmma (async proxy).
  const auto decode_half = [&](int s, uint32_t j, int part) {
    decode_fp4_half_row_select<Layout::kFp4Format>(
        decoder, smem.fp4_tiles + s * Layout::kFp4Bytes, smem.scale_tiles + s * Layout::kScaleBytes,
        smem.decoded + (j & 1) * Layout::kDecodedBytes, math_thread, 2 * part,
        static_cast<int>(ring[s * kSlotWords + my_record_word + 1]));
    fence_proxy_async_shared();
  };
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) accumulator[h][i] = 0.0f;
  barrier_wait(&smem.full[stage], phase);
  decode_half(stage, count, 0);
  decode_half(stage, count, 1);
#pragma unroll 1
  for (int kb = 0; kb < k_blocks; ++kb) {
    // Stage kb's `full` was waited for before its decode: its scale slot is readable. The four promotion scales
    // fl(a_scale * factor) (w4a8_promote_m64n128's), gate on even 8-column groups, up on odd.
    const uint32_t* const slot = ring + stage * kSlotWords;
    const float factor_gate = __uint_as_float(slot[Layout::kGateRecordWord]);
    const float factor_up = __uint_as_float(slot[Layout::kUpRecordWord]);
    const float scale_a0 = __uint_as_float(slot[scale_row]), scale_a1 = __uint_as_float(slot[scale_row + 8]);
    const float scale0_gate = scale_a0 * factor_gate, scale0_up = scale_a0 * factor_up;
    const float scale1_gate = scale_a1 * factor_gate, scale1_up = scale_a1 * factor_up;
    const uint32_t buffer = count & 1u;
    named_barrier_sync(kW4a8V10Gemm1DecodeBarrier, 256);  // every row of decoded kb is written and fenced
    const uint32_t a_low = a_descriptor0 + stage * (Layout::kABytes >> 4);
    const uint32_t b_low = b_descriptor0 + buffer * (Layout::kDecodedBytes >> 4);
    const int next_stage = stage + 1 == kStages ? 0 : stage + 1;
    const uint32_t next_phase = next_stage == 0 ? phase ^ 1u : phase;
    const bool more = kb + 1 < k_blocks;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wgmma_group_m64n128_e4m3(partial, a_low, b_low + ((128 * h * kBlockK) >> 4));
      if (more) {  // half of the next k-block's decode while the tensor cores run this group
        if (h == 0) barrier_wait(&smem.full[next_stage], next_phase);
        decode_half(next_stage, count + 1, h);
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
      if (h == 1 && lane == 0) barrier_arrive(&smem.empty[stage]);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float scale0 = j % 2 ? scale0_up : scale0_gate, scale1 = j % 2 ? scale1_up : scale1_gate;
        accumulator[h][4 * j + 0] += partial[4 * j + 0] * scale0;
        accumulator[h][4 * j + 1] += partial[4 * j + 1] * scale0;
        accumulator[h][4 * j + 2] += partial[4 * j + 2] * scale1;
        accumulator[h][4 * j + 3] += partial[4 * j + 3] * scale1;
      }
    }
    ++count;
    stage = next_stage;
    phase = next_phase;
  }
}

// params as the old GEMM-1 launch (grouped_gemm1_w4a8): n = 2 intermediate (packed, kGateUpInterleaved8), k =
// hidden, out E4M3 [rows, n / 2], out_scales [rows, n / 256], activation / limit / alpha, topk_weights. out_map: out
// as bytes [m_capacity][n / 2], boxes 128 B x Layout::kOutMapRows rows, 128-byte swizzle (the epilogue's TMA stores).
template <int kStages, Fp4Format kFormat>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_w4a8_v10_gemm1_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                               const __grid_constant__ CUtensorMap out_map, const W4a8GemmParams params) {
  using Layout = W4a8V10Gemm1Layout<kStages, kFormat>;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kBlockN = Layout::kBlockN;
  extern __shared__ uint8_t shared_raw[];
  const W4a8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);
  W4a8V10MathStart start;
  if (!start_w4a8_v10_kernel(smem, table, &a_map, &b_map, params, start)) return;  // the producer warpgroup ran
  const int k_blocks = start.k_blocks, n_tiles = start.n_tiles, total_tiles = start.total_tiles;
  const int math_wg = start.math_wg, warp_in_wg = start.warp_in_wg, math_thread = start.math_thread;
  const int scale_row = start.scale_row;
  const uint32_t a_descriptor0 = start.a_descriptor0, b_descriptor0 = start.b_descriptor0;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x % 128 == 0) prefetch_tensor_map(&out_map);

  int stage = 0;
  uint32_t phase = 0, count = 0;
  int expert = 0;
  float accumulator[2][64];
  float partial[64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile(table, tile, n_tiles, kBlockM, expert);
    const int m0 = __shfl_sync(0xffffffffu, t.m0, 0);
    const int m_end = __shfl_sync(0xffffffffu, t.m_end, 0);
    const int n_tile = __shfl_sync(0xffffffffu, t.n_tile, 0);
    expert = __shfl_sync(0xffffffffu, expert, 0);
    const bool active = m_end - m0 > 64 * math_wg;
    w4a8_v10_gemm1_tile_mainloop<Layout>(accumulator, partial, smem, k_blocks, math_thread, scale_row, a_descriptor0,
                                         b_descriptor0, stage, phase, count, params.decoder);
    if (active)
      swiglu_quant_fp8_rows_epilogue<false, 2, RowsAmaxLocal, true>(
          accumulator, smem.bf16_staging, m0 + math_wg * 64, m_end, n_tile, params.n / 2, params.topk_weights,
          static_cast<uint8_t*>(params.out), params.out_scales, params.activation, params.limit, params.alpha, 0,
          RowsAmaxLocal{}, &out_map);
  }
  bulk_wait_all();  // the epilogue's bulk copies and TMA stores
}

}  // namespace megamoe::kernels::sm90

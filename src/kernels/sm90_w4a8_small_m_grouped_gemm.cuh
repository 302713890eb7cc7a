// W4A8 grouped GEMM for small groups (64-row tiles, 8-64 rows per expert), sm_90a: the numbers and the
// decode of sm90_w4a8_grouped_gemm.cuh, with FOUR math warpgroups of 64 columns each (wgmma m64n64)
// instead of two of 128.
//
// Why (docs/grouped_gemm.md "W4A8 v4"): at 8-32 rows per expert the MMAs are tiny and the kernel's time
// is the FP4 -> FP8 decode of every weight element, which two math warps per scheduler, each decoding a
// whole 128-K row with long dependency chains, issue at ~0.45 instructions per cycle (ncu). Four
// warpgroups halve the accumulator registers (32 + 32 partials), so 4 x 128 math threads fit beside
// the producer warpgroup (640 threads), each decoding HALF a row: twice the warps to hide the decode's
// latency, half the work per thread per k-block.
//
// CTA = 5 warpgroups, tile 64 x 256 (the same tile, TMA boxes, scale ring and producer pieces as the
// 64-row 2-warpgroup kernel). Math warpgroup g owns tile columns 64g .. 64g + 63: g = 0, 1 the gate
// rows (block record 0), g = 2, 3 the up rows (record 1) of GEMM 1's interleaved W13 (plain GEMMs: just
// columns). Per k-block each warpgroup decodes its 64 weight rows (two threads per row, 64 K each) into
// its private double-buffered FP8 tile, as the 2-warpgroup mainloop does.
// SwiGLU epilogue: warp w of gate warpgroup g hands its accumulators to warp w of up warpgroup g + 2
// (named barrier per warp pair); the up warpgroups activate, and the per-row amax over the output's 128
// columns (64 in each up warpgroup) is combined through shared memory (one 256-thread barrier between the
// two up warpgroups); each up warpgroup quantizes and stores its 64 columns, warpgroup 2 the row's scale.
// The amax is a max, so the result is bit-identical to the 2-warpgroup kernel's.
//
// NOTES:
// - Named barriers: 1 = the two up warpgroups' amax exchange (256 threads; kInterleaved8: the four math
//   warpgroups' amax exchange, 512 threads, once per tile), 2..5 = the decode barrier of math warpgroup 0..3
//   (128), 8 + 4 p + w = warp pair p (gate g = p, up g = p + 2), warp w (64; kGateUp only).
// - Register pool: __launch_bounds__(640, 1) caps ptxas at 96 per thread (65,536 / 640 rounded down to a
//   multiple of 8), 61,440 in all; the producer warpgroup drops to 32 and the math warpgroups take
//   112 (32 x 128 + 112 x 512 = 61,440; at 24 the producer side spilled 8 bytes).
// - Everything else (ring protocol, stage phases in lockstep, rows past the expert's end computed and
//   never stored, the decoded buffer reuse argument) as sm90_w4a8_grouped_gemm.cuh's NOTES.
//
// kInterleaved8 (session 18; docs/grouped_gemm.md "W4A8 small-M GEMM 1 on interleaved W13"): GEMM 1 on W13 packed
// GemmRole::kGateUpInterleaved8 (gate/up rows interleaved by 8, block records unchanged per canonical 128-row
// block: the producer, TMA boxes and scale ring are the kGateUp kernel's). Packed tile column 128 h + 16 p + c
// (c < 8) is gate row 64 h + 8 p + c of the tile's gate block, + 8 the up row (sm90_w4a8_v10_gemm1.cuh NOTES), so
// math warpgroup g's 64 packed columns (h = g / 2, p = 4 (g % 2) + j / 2 for its 8-column group j) hold gate (j
// even) AND up (j odd) of the 32 outputs 32 g .. 32 g + 31; fragment register 4 j + 2 r + c is output column
// 32 g + 8 (j / 2) + 2 (lane % 4) + c of row r. Hence:
// - Decode: thread t decodes half of its warpgroup's packed row t / 2 with that row's own block record: gate for
//   ((t / 2) / 8) % 2 == 0, i.e. (t / 16) % 2 == 0, up otherwise (v10 GEMM 1's (packed row / 8) % 2).
// - Promotion: acc += partial * fl(a_scale * factor) with the gate factor on even 8-column groups, the up factor
//   on odd ones (the element's block, as w4a8_promote_m64n128 / v10 GEMM 1).
// - Epilogue in-thread (w4a8_interleaved_swiglu_epilogue, shared with the 2-warpgroup kernel's kSwigluInterleavedFp8
//   since session 19): value = activate(acc[8 q + 2 r + c], acc[8 q + 4 + 2 r + c]) (gate, up), no warp-pair
//   handoff and no pair barriers. The row amax over the 128 outputs: each warpgroup's partial over its 32
//   (thread's 8, then the quad's shuffles) goes to shared [parity][4][64], ONE named barrier kW4a8SmallAmaxBarrier
//   (id 1) over the 512 math threads, then every thread takes the max over the 4 partials (exact and
//   order-free: fmaxf). The slots are double-buffered by the CTA's tile parity: a warpgroup writes the buffer of
//   tile t + 2 only after the barrier of tile t + 1, which no warpgroup reaches before its reads of tile t (program
//   order), so one barrier per tile orders both hazards (RowsAmaxExchange's argument, sm90_fp8_grouped_gemm.cuh).
//   Every math warp reaches the barrier every tile (warps without rows write amax 0, never read for a stored row).
//   Each warpgroup quantizes and stores its 32 outputs per row; warpgroup 0 stores the row's scale.
// - Bit-identical to the kGateUp kernels: same decoded bytes (the packing moves rows, not bytes; each row its own
//   block's p), same partials (an element's 128-K partial is the same 4 k32 steps of the same A and decoded B row,
//   independent of its column in the n64 group), same promotion (scale0 = fl(a_scale * factor) of the element's
//   block, k-block order from 0), same per-element epilogue operations (activate, exact amax, scale = fl(fl(amax
//   |w|) max 1e-10 / 448), code = e4m3(fl(fl(v w) / scale)) satfinite).
// - Shared memory: no gate exchange (16 KiB less than kGateUp's), the amax slots 2 x 4 x 64 floats. The launcher's
//   max_stages still gives 5 stages (a 6th, ~26 KiB with its ring slot, does not fit in the 16 KiB saved); the
//   outputs do not depend on the depth.
// - Registers: 4 promotion scales instead of 2 and a per-thread decode exponent; the epilogue activates in place.
#pragma once

#include "kernels/sm90_w4a8_grouped_gemm.cuh"

namespace megamoe::kernels::sm90 {

constexpr int kW4a8SmallMathWarpgroups = 4;
constexpr int kW4a8SmallThreadsPerCta = 128 * (1 + kW4a8SmallMathWarpgroups);
constexpr int kW4a8SmallColumns = kW4a8BlockN / kW4a8SmallMathWarpgroups;  // 64 per math warpgroup
constexpr uint32_t kW4a8SmallAmaxBarrier = 1;
constexpr uint32_t kW4a8SmallDecodeBarrier = 2;  // + math warpgroup
constexpr uint32_t kW4a8SmallPairBarrier = 8;    // + 4 * pair + warp
// Math warpgroups whose partial row amax the kInterleaved8 epilogue combines (all four, 512 threads).
constexpr int kW4a8SmallAmaxThreadsInterleaved = 128 * kW4a8SmallMathWarpgroups;

template <int kStages, Fp4Format kFormat, W4a8Epilogue kEpilogue, bool kInterleaved8 = false>
struct W4a8SmallMLayout {
  static_assert(!kInterleaved8 || kEpilogue == W4a8Epilogue::kSwigluQuantFp8,
                "the by-8 interleave is GEMM 1's W13 packing (SwiGLU epilogue)");
  static constexpr bool kGateUpInterleaved8 = kInterleaved8;
  // The names W4a8GemmShared, produce_w4a8_tile and produce_w4a8_scales read (as W4a8GemmLayout).
  static constexpr int kSubTiles = 1;
  static constexpr int kStageCount = kStages;
  static constexpr int kBlockN = kW4a8BlockN;
  static constexpr bool kScalesInShared = false;
  static constexpr bool kW4a8SharedScales = true;
  static constexpr Fp4Format kFp4Format = kFormat;
  static constexpr int kBlockM = 64;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kFp4Bytes = kW4a8BlockN * kW4a8Fp4RowBytes;
  static constexpr int kScaleBytes = kW4a8BlockN * Fp4Traits<kFormat>::kScaleBytesPerRow;
  static constexpr int kDecodedBytes = kW4a8SmallColumns * kBlockK;  // one warpgroup's FP8 B tile (64 rows)
  static constexpr int kDecodedOffset = 0;
  static constexpr int kAOffset = kDecodedOffset + 2 * kW4a8SmallMathWarpgroups * kDecodedBytes;
  static constexpr int kFp4Offset = kAOffset + kStages * kABytes;
  static constexpr int kScaleOffset = kFp4Offset + kStages * kFp4Bytes;
  // SwiGLU: per warp pair 16 registers x 64 threads of gate values in flight (two pairs: 16 KiB), then
  // the up warpgroups' per-row amax [2][64] floats. kInterleaved8: no gate exchange, the per-row amax
  // [2 tile parities][4 warpgroups][64] floats.
  static constexpr int kExchangeRegisters = 16;
  static constexpr int kExchangeOffset = kScaleOffset + kStages * kScaleBytes;
  static constexpr int kGateExchangeBytes = kInterleaved8 ? 0 : 2 * kExchangeRegisters * 128 * 4;
  static constexpr int kAmaxBytes = kInterleaved8 ? 2 * kW4a8SmallMathWarpgroups * kBlockM * 4 : 2 * kBlockM * 4;
  static constexpr int kExchangeBytes =
      kEpilogue == W4a8Epilogue::kSwigluQuantFp8 ? kGateExchangeBytes + kAmaxBytes : 0;
  static constexpr int kAmaxOffset = kExchangeOffset + kGateExchangeBytes;
  static constexpr int kScaleRecords = kW4a8BlockN / 128;
  static constexpr int kScaleSlotWords = kBlockM + 2 * kScaleRecords;
  static constexpr int kScaleRingOffset = kExchangeOffset + kExchangeBytes;
  static constexpr int kScaleRingBytes = (kStages * kScaleSlotWords * 4 + 15) / 16 * 16;
  static constexpr int kBarrierOffset = kScaleRingOffset + kScaleRingBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  static constexpr int kEmptyArrivals = kW4a8SmallMathWarpgroups * 4;  // lane 0 of every math warp
  static constexpr int shared_bytes(int num_experts) {
    return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts);
  }
  static_assert(kABytes % 1024 == 0 && kFp4Bytes % 1024 == 0 && kDecodedBytes % 1024 == 0 && kScaleBytes % 16 == 0,
                "stage alignment");
};

// Math warpgroup `math_wg` (0..3, columns 64 math_wg ..), one tile: decode + wgmma m64n64 + promotion over
// k_blocks, in the order of w4a8_tile_mainloop (decode of kb + 1 between the wgmma issue and wait of kb).
// warp_has_rows: this warp holds a row of the tile's expert (else it skips the promotion; warp-uniform).
template <class Layout>
__device__ __forceinline__ void w4a8_small_m_mainloop(float (&accumulator)[32], float (&partial)[32],
                                                      const W4a8GemmShared<Layout>& smem, bool warp_has_rows,
                                                      int k_blocks, int math_wg,
                                                      PipelineCursor<Layout::kStageCount>& cursor, int decoder) {
  constexpr int kStages = Layout::kStageCount;
  constexpr Fp4Format kFormat = Layout::kFp4Format;
  constexpr int kScaleBytesPerRow = Fp4Traits<kFormat>::kScaleBytesPerRow;
  const int lane = threadIdx.x % 32;
  const int thread_in_wg = threadIdx.x % 128;
  const int row_in_tile = (thread_in_wg / 32) * 16 + lane / 4;
  const uint32_t decode_barrier = kW4a8SmallDecodeBarrier + math_wg;
  uint8_t* my_decoded = smem.decoded + math_wg * 2 * Layout::kDecodedBytes;
  // Decode record: kGateUp, the warpgroup's (gate for 0, 1, up for 2, 3); kInterleaved8, this thread's packed
  // row's (t / 2) (gate for even 8-row groups, up for odd: (t / 16) % 2).
  const int record_word =
      Layout::kBlockM + 2 * (Layout::kGateUpInterleaved8 ? (thread_in_wg / 16) % 2 : math_wg / 2);
  auto slot_word = [&](int stage, int word) { return smem.scale_ring[stage * Layout::kScaleSlotWords + word]; };
  // Two threads per weight row: thread t decodes chunks 2 (t & 1), +1 of row t / 2 of this warpgroup's 64.
  auto decode = [&](int s, int kb) {
    const uint8_t* fp4 = smem.fp4_tiles + s * Layout::kFp4Bytes + math_wg * kW4a8SmallColumns * kW4a8Fp4RowBytes;
    const uint8_t* scales = smem.scale_tiles + s * Layout::kScaleBytes + math_wg * kW4a8SmallColumns * kScaleBytesPerRow;
    uint8_t* decoded = my_decoded + (kb & 1) * Layout::kDecodedBytes;
    const int decode_exponent = static_cast<int>(slot_word(s, record_word + 1));
    // v7: slots 2 (t & 1), +1 of the row (physical; old and v8: logical chunks). Same rows covered.
    decode_fp4_half_row_select<kFormat>(decoder, fp4, scales, decoded, thread_in_wg / 2, 2 * (thread_in_wg & 1),
                                        decode_exponent);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  };
#pragma unroll
  for (int i = 0; i < 32; ++i) accumulator[i] = 0.0f;
  // Every warp of this warpgroup has retired the previous tile's wgmmas before any overwrites buffer 0.
  named_barrier_sync(decode_barrier, 128);
  barrier_wait(&smem.full[cursor.stage], cursor.phase);
  decode(cursor.stage, 0);
  for (int kb = 0; kb < k_blocks; ++kb) {
    // Stage kb's `full` was waited for before its decode: its scale slot is readable. Promotion scales
    // fl(a_scale * factor): kGateUp, the warpgroup's block (even = odd); kInterleaved8, the gate block's on even
    // 8-column groups, the up block's on odd ones.
    // (The kGateUp statements are the pre-kInterleaved8 ones: its SASS is unchanged.)
    float scale0_even, scale1_even, scale0_odd, scale1_odd;
    if constexpr (Layout::kGateUpInterleaved8) {
      const float a_scale0 = __uint_as_float(slot_word(cursor.stage, row_in_tile));
      const float a_scale1 = __uint_as_float(slot_word(cursor.stage, row_in_tile + 8));
      const float factor_gate = __uint_as_float(slot_word(cursor.stage, Layout::kBlockM));
      const float factor_up = __uint_as_float(slot_word(cursor.stage, Layout::kBlockM + 2));
      scale0_even = a_scale0 * factor_gate;
      scale1_even = a_scale1 * factor_gate;
      scale0_odd = a_scale0 * factor_up;
      scale1_odd = a_scale1 * factor_up;
    } else {
      const float factor = __uint_as_float(slot_word(cursor.stage, record_word));
      const float scale0 = __uint_as_float(slot_word(cursor.stage, row_in_tile)) * factor;
      const float scale1 = __uint_as_float(slot_word(cursor.stage, row_in_tile + 8)) * factor;
      scale0_even = scale0_odd = scale0;
      scale1_even = scale1_odd = scale1;
    }
    named_barrier_sync(decode_barrier, 128);  // every row of decoded kb is written and fenced
    const uint32_t b_base = smem_address(my_decoded + (kb & 1) * Layout::kDecodedBytes);
    const uint32_t a_base = smem_address(smem.a_tiles + cursor.stage * Layout::kABytes);
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(partial[i]);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
      wgmma_m64n64k32_e4m3(partial, make_kmajor_sw128_descriptor(a_base + k_step * 32),
                           make_kmajor_sw128_descriptor(b_base + k_step * 32), k_step > 0 ? 1u : 0u);
    wgmma_commit();
    if (kb + 1 < k_blocks) {  // decode the next k-block while the tensor cores run
      const int next_stage = cursor.stage + 1 == kStages ? 0 : cursor.stage + 1;
      barrier_wait(&smem.full[next_stage], next_stage == 0 ? cursor.phase ^ 1 : cursor.phase);
      decode(next_stage, kb + 1);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(partial[i]);
    if (lane == 0) barrier_arrive(&smem.empty[cursor.stage]);
    cursor.advance();
    if (warp_has_rows)
      w4a8_promote_gate_up_groups<32>(accumulator, partial, scale0_even, scale1_even, scale0_odd, scale1_odd);
  }
}

// GEMM 1 epilogue of the small-M kernel (header comment): gate warpgroups 0, 1 -> up warpgroups 2, 3 per
// warp pair; the up warpgroups activate, combine the row amax of the output's 128 columns, apply the
// top-k weight, quantize (formats::quantize_fp8_activations rule, as w4a8_swiglu_quant_fp8_epilogue)
// and store their 64 columns each (out: e4m3 [rows, out_cols], out_scales [rows, out_cols / 128]).
template <class Layout>
__device__ __forceinline__ void w4a8_small_m_swiglu_epilogue(float (&accumulator)[32], const W4a8GemmShared<Layout>& smem,
                                                             int math_wg, const MathRows<1>& where, bool warp_has_rows,
                                                             int n_tile, int out_cols, const float* topk_weights,
                                                             uint8_t* out, float* out_scales, int activation,
                                                             float limit, float alpha) {
  constexpr int kChunk = Layout::kExchangeRegisters;
  const int lane = threadIdx.x % 32;
  const int thread_in_wg = threadIdx.x % 128;
  const int warp = thread_in_wg / 32;
  const int pair = math_wg % 2;  // gate g = pair, up g = pair + 2: the same 64 output columns
  const bool gate = math_wg < 2;
  float* exchange = smem.exchange + pair * kChunk * 128;
  float* row_amax = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem.exchange) +
                                             (Layout::kAmaxOffset - Layout::kExchangeOffset));  // [2][64]
  float amax[2] = {0.0f, 0.0f};
  if (warp_has_rows) {  // both warps of a pair hold the same rows
    const uint32_t pair_barrier = kW4a8SmallPairBarrier + 4 * pair + warp;
#pragma unroll
    for (int chunk = 0; chunk < 32 / kChunk; ++chunk) {
      if (gate) {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) exchange[r * 128 + thread_in_wg] = accumulator[chunk * kChunk + r];
      }
      named_barrier_sync(pair_barrier, 64);
      if (!gate) {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) {
          const int i = chunk * kChunk + r;
          const float value = activate(exchange[r * 128 + thread_in_wg], accumulator[i], activation, limit, alpha);
          accumulator[i] = value;
          amax[(i % 4) / 2] = fmaxf(amax[(i % 4) / 2], fabsf(value));
        }
      }
      named_barrier_sync(pair_barrier, 64);  // the pair's exchange slots are free again
    }
  }
  if (gate) return;
  // Up warpgroups: row amax over this warpgroup's 64 columns (the 4 lanes of a row), then over both.
  const int up = math_wg - 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
    if (lane % 4 == 0) row_amax[up * 64 + warp * 16 + 8 * h + lane / 4] = amax[h];
  }
  named_barrier_sync(kW4a8SmallAmaxBarrier, 256);
#pragma unroll
  for (int h = 0; h < 2; ++h)
    amax[h] = fmaxf(amax[h], row_amax[(1 - up) * 64 + warp * 16 + 8 * h + lane / 4]);
  // The amax slots are rewritten only after the next tile's mainloop, whose decode barrier every warp
  // of this warpgroup passes after this read; the other up warpgroup reads them before its own.
  named_barrier_sync(kW4a8SmallAmaxBarrier, 256);
  if (!warp_has_rows) return;
  const int col_base = n_tile * 128 + up * kW4a8SmallColumns + 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!where.valid[0][h]) continue;
    const int row = where.rows[0][h];
    // amax |fl(v * w)| = fl(amax |v| * |w|) (rounding is monotonic), so the weight multiplies here.
    const float weight = topk_weights ? topk_weights[row] : 1.0f;
    const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax[h], fabsf(weight)), 1e-10f), 448.0f);
    uint8_t* out_row = out + static_cast<int64_t>(row) * out_cols + col_base;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 pair_values = make_float2(__fdiv_rn(__fmul_rn(accumulator[4 * j + 2 * h], weight), scale),
                                             __fdiv_rn(__fmul_rn(accumulator[4 * j + 2 * h + 1], weight), scale));
      *reinterpret_cast<__nv_fp8x2_storage_t*>(out_row + 8 * j) =
          __nv_cvt_float2_to_fp8x2(pair_values, __NV_SATFINITE, __NV_E4M3);
    }
    if (up == 0 && lane % 4 == 0) out_scales[static_cast<int64_t>(row) * (out_cols / 128) + n_tile] = scale;
  }
}

template <int kStages, Fp4Format kFormat, W4a8Epilogue kEpilogue, bool kInterleaved8 = false>
__global__ void __launch_bounds__(kW4a8SmallThreadsPerCta, 1)
    sm90_w4a8_small_m_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                          const __grid_constant__ CUtensorMap b_map, const W4a8GemmParams params) {
  using Layout = W4a8SmallMLayout<kStages, kFormat, kEpilogue, kInterleaved8>;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr uint32_t kProducerRegs = 32;
  constexpr uint32_t kMathRegs = 112;
  static_assert(kProducerRegs * 128 + kMathRegs * 128 * kW4a8SmallMathWarpgroups <= 96 * kW4a8SmallThreadsPerCta,
                "the launch's 96 x 640 registers (NOTES)");

  extern __shared__ uint8_t shared_raw[];
  const W4a8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);

  const int warpgroup = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  start_w4a8_kernel(smem, table, &a_map, &b_map, params);

  const int k_blocks = params.k / kBlockK;
  const int n_tiles = params.n / kW4a8BlockN;
  const int total_tiles = table.tile_prefix[params.num_experts] * n_tiles;

  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    run_w4a8_producer_warpgroup(smem, table, &a_map, &b_map, params, total_tiles, n_tiles, k_blocks);
    return;
  }

  registers_increase<kMathRegs>();
  const int math_wg = warpgroup - 1;
  const int thread_in_wg = threadIdx.x % 128;
  const int row_in_tile = (thread_in_wg / 32) * 16 + lane / 4;
  PipelineCursor<kStages> cursor;
  int expert = 0;
  float accumulator[32];
  float partial[32];
  uint32_t parity = 0;  // kInterleaved8: the CTA's tile parity (the epilogue's amax slots)
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile(table, tile, n_tiles, kBlockM, expert);
    const MathRows<1> where(t.m0, t.m_end, row_in_tile);
    const bool warp_has_rows = __any_sync(0xffffffffu, where.valid[0][0] || where.valid[0][1]);
    w4a8_small_m_mainloop<Layout>(accumulator, partial, smem, warp_has_rows, k_blocks, math_wg, cursor,
                                  params.decoder);
    if constexpr (kEpilogue == W4a8Epilogue::kStoreBf16) {
      if (warp_has_rows) {
        float (&as_sub_tiles)[1][32] = *reinterpret_cast<float (*)[1][32]>(&accumulator);
        w4a8_store_bf16_epilogue<1, 32>(as_sub_tiles, where, static_cast<__nv_bfloat16*>(params.out), params.n,
                                        t.n_tile * kW4a8BlockN + math_wg * kW4a8SmallColumns);
      }
    } else if constexpr (kInterleaved8) {
      // The in-thread SwiGLU of the header comment (w4a8_interleaved_swiglu_epilogue, n64 fragments, four
      // warpgroups); the amax slots [parity][warpgroup][row] at Layout::kAmaxOffset.
      float (&as_sub_tiles)[1][32] = *reinterpret_cast<float (*)[1][32]>(&accumulator);
      w4a8_interleaved_swiglu_epilogue<1, 32, kW4a8SmallMathWarpgroups, false>(
          as_sub_tiles, smem.row_amax + parity * (kW4a8SmallMathWarpgroups * kBlockM), math_wg, where,
          kW4a8SmallAmaxBarrier, t.n_tile, params.n / 2, params.topk_weights, static_cast<uint8_t*>(params.out),
          params.out_scales, params.activation, params.limit, params.alpha);
      parity ^= 1u;
    } else {
      w4a8_small_m_swiglu_epilogue<Layout>(accumulator, smem, math_wg, where, warp_has_rows, t.n_tile, params.n / 2,
                                           params.topk_weights, static_cast<uint8_t*>(params.out), params.out_scales,
                                           params.activation, params.limit, params.alpha);
    }
  }
}

}  // namespace megamoe::kernels::sm90

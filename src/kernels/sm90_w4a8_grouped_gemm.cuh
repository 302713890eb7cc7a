// Persistent, warp-specialized W4A8 grouped GEMM for sm_90a: NVFP4 / MXFP4 weights decoded to FP8 E4M3
// in shared memory inside the mainloop, FP8 activations, FP8 wgmma, FP32 accumulation with per-128-K
// promotion (the numbers: grouped_gemm.h, "W4A8"; the decode: sm90_fp4_decode.cuh).
//
//   out[r, n] = sum_kb ( sum_{k in kb} e4m3(A[r,k]) * w8_e[n,k] ) * a_scale[r,kb] * factor_e[n/128,kb]
//
// CTA = 3 warpgroups, tiles BLOCK_M x 256 (split-N: math warpgroup w owns columns 128w..128w+127 of the
// tile). Warpgroup 0 (one thread) streams, per 128-K slice, the A tile (TMA, 128-byte swizzle), the
// packed FP4 tile [256 rows, 64 bytes] (TMA, 64-byte swizzle) and the tile's group scales (one bulk copy:
// the packed scale layout makes them contiguous) into a ring of stages (`full` / `empty` mbarriers).
// Each math warpgroup decodes its own 128 weight rows (one row per thread) into a private,
// double-buffered FP8 tile in the wgmma operand layout, so only a warpgroup-local barrier orders decode
// and wgmma. Per k-block:
//   bar.sync (decoded kb visible) -> wgmma sub-tile 0 of kb (async) -> decode kb+1 into the other buffer
//   (overlaps the tensor cores) -> wait -> promote; further sub-tiles (128-row tiles) follow; the stage is
//   released once its last wgmma has retired.
// Epilogues as the FP8-block kernel: BF16 store (GEMM 2 / plain) or gate x up SwiGLU + top-k weight +
// FP8 requant (GEMM 1; the gate warpgroup hands its accumulators over through shared memory).
//
// NOTES:
// - The decoded buffer written at k-block kb+1 was last read by the wgmma of kb-1, which every warp of
//   the warpgroup waited for before the bar.sync of kb: no further barrier is needed.
// - Writes by generic st.shared are made visible to the wgmma (async proxy) by fence.proxy.async before
//   the bar.sync.
// - Producer and math warpgroups iterate the identical (tile, k-block) sequence (sm90_grouped_schedule),
//   so their stage index and phase bit stay in lockstep.
// - Rows past the expert's end (next expert, or TMA zero fill) are computed, never stored.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/sm90_fp4_decode.cuh"
#include "kernels/sm90_gemm_heuristics.h"
#include "kernels/sm90_grouped_schedule.cuh"
#include "kernels/sm90_ptx.cuh"

namespace megamoe::kernels::sm90 {

enum class W4a8Epilogue : int {
  kStoreBf16,       // out[r, n] = bf16(acc)
  kSwigluQuantFp8,  // gate (math warpgroup 0) x up (math warpgroup 1) -> FP8 + per-128 scale
};

struct W4a8BlockScaleDevice {
  float factor;
  int32_t decode_exponent;
};

struct W4a8GemmParams {
  const float* a_scales = nullptr;                // [m_capacity, k/128]
  const uint8_t* group_scales = nullptr;          // [E, k/128, n, 128/group]
  const W4a8BlockScaleDevice* blocks = nullptr;   // [E, n/128, k/128]
  const int32_t* expert_offsets = nullptr;        // [E+1], device
  const float* topk_weights = nullptr;            // optional [m_capacity] (SwiGLU epilogue)
  void* out = nullptr;                            // bf16 [m_capacity, n] | e4m3 [m_capacity, n/2]
  float* out_scales = nullptr;                    // SwiGLU: [m_capacity, n/256]
  int m_capacity = 0, num_experts = 0, n = 0, k = 0;
  int activation = 0;                             // 0 = silu*up, 1 = clamped SwiGLU
  float limit = 0.f, alpha = 0.f;
};

constexpr int kW4a8BlockN = 256;
constexpr int kW4a8Fp4RowBytes = kBlockK / 2;  // 64 bytes of FP4 per row per 128-K slice
// 16-byte FP4 chunks of a row decoded together. v1 decoded one at a time (unroll 1, to spare registers
// beside the accumulators) and was latency bound: ~2x slower than FP8 at large M (docs/grouped_gemm.md).
constexpr int kW4a8DecodeChunksInFlight = 4;

template <int kSubTilesM, int kStages, Fp4Format kFormat, W4a8Epilogue kEpilogue>
struct W4a8GemmLayout {
  static constexpr int kBlockM = 64 * kSubTilesM;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kFp4Bytes = kW4a8BlockN * kW4a8Fp4RowBytes;
  static constexpr int kScaleBytes = kW4a8BlockN * Fp4Traits<kFormat>::kScaleBytesPerRow;
  static constexpr int kDecodedBytes = 128 * kBlockK;  // one warpgroup's FP8 B tile
  // Decoded tiles first (1024-aligned for the 128-byte swizzle), then the stage ring.
  static constexpr int kDecodedOffset = 0;
  static constexpr int kAOffset = kDecodedOffset + 2 * kMathWarpgroups * kDecodedBytes;
  static constexpr int kFp4Offset = kAOffset + kStages * kABytes;
  static constexpr int kScaleOffset = kFp4Offset + kStages * kFp4Bytes;
  static constexpr int kExchangeRegisters = 16;  // 8 KiB of gate values in flight
  static constexpr int kExchangeOffset = kScaleOffset + kStages * kScaleBytes;
  static constexpr int kExchangeBytes = kEpilogue == W4a8Epilogue::kSwigluQuantFp8 ? kExchangeRegisters * 128 * 4 : 0;
  static constexpr int kBarrierOffset = kExchangeOffset + kExchangeBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  static constexpr int shared_bytes(int num_experts) {
    return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts);
  }
  static_assert(kABytes % 1024 == 0 && kFp4Bytes % 1024 == 0 && kScaleBytes % 16 == 0, "stage alignment");
};

__device__ __forceinline__ float w4a8_activate(float gate, float up, int kind, float limit, float alpha) {
  if (kind == 0) return gate / (1.0f + expf(-gate)) * up;
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
}

__device__ __forceinline__ void bulk_load(void* smem_destination, const void* source, uint32_t bytes,
                                          uint64_t* barrier) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_destination, source, bytes,
                           barrier);
}

__device__ __forceinline__ W4a8BlockScaleDevice load_block(const W4a8BlockScaleDevice* block) {
  const int2 bits = __ldg(reinterpret_cast<const int2*>(block));
  return {__int_as_float(bits.x), bits.y};
}

template <int kSubTilesM, int kStages, Fp4Format kFormat, W4a8Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_w4a8_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                  const __grid_constant__ CUtensorMap b_map, const W4a8GemmParams params) {
  using Layout = W4a8GemmLayout<kSubTilesM, kStages, kFormat, kEpilogue>;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kScaleBytesPerRow = Fp4Traits<kFormat>::kScaleBytesPerRow;
  constexpr int kDecodeChunksInFlight = kW4a8DecodeChunksInFlight;

  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (smem_address(shared_raw) & 1023)) & 1023);
  uint8_t* decoded = shared + Layout::kDecodedOffset;
  uint8_t* a_tiles = shared + Layout::kAOffset;
  uint8_t* fp4_tiles = shared + Layout::kFp4Offset;
  uint8_t* scale_tiles = shared + Layout::kScaleOffset;
  float* exchange = reinterpret_cast<float*>(shared + Layout::kExchangeOffset);
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarrierOffset);
  uint64_t* empty = full + kStages;
  const ExpertTileTable table(reinterpret_cast<int*>(shared + Layout::kTableOffset), params.num_experts);

  const int warpgroup = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], kMathWarpgroups * 4);  // lane 0 of every math warp
    }
    barrier_init_fence();
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&b_map);
  }
  if (threadIdx.x / 32 == 1)
    build_expert_tile_table<kBlockM>(table, params.expert_offsets, params.num_experts, params.m_capacity);
  __syncthreads();

  const int k_blocks = params.k / kBlockK;
  const int n_tiles = params.n / kW4a8BlockN;
  const int total_tiles = table.tile_prefix[params.num_experts] * n_tiles;

  if (warpgroup == 0) {
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    int stage = 0;
    uint32_t phase = 0;
    int expert = 0;
    constexpr uint32_t kStageBytes = Layout::kABytes + Layout::kFp4Bytes + Layout::kScaleBytes;
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const TileCoordinates where = locate_tile(table, tile, n_tiles, kBlockM, expert);
      const int b_row = expert * params.n + where.n_tile * kW4a8BlockN;
      for (int kb = 0; kb < k_blocks; ++kb) {
        barrier_wait(&empty[stage], phase ^ 1);
        barrier_arrive_expect_bytes(&full[stage], kStageBytes);
        tma_load_2d(a_tiles + stage * Layout::kABytes, &a_map, kb * kBlockK, where.m0, &full[stage]);
        tma_load_2d(fp4_tiles + stage * Layout::kFp4Bytes, &b_map, kb * kW4a8Fp4RowBytes, b_row, &full[stage]);
        const uint8_t* scales = params.group_scales +
                                ((static_cast<int64_t>(expert) * k_blocks + kb) * params.n +
                                 where.n_tile * kW4a8BlockN) * kScaleBytesPerRow;
        bulk_load(scale_tiles + stage * Layout::kScaleBytes, scales, Layout::kScaleBytes, &full[stage]);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }

  registers_increase<kMathRegisters>();
  const int math_wg = warpgroup - 1;  // = which 128-column half of the tile
  const int thread_in_wg = threadIdx.x % 128;
  const int row_in_tile = (thread_in_wg / 32) * 16 + lane / 4;
  const int n_blocks = params.n / 128;
  uint8_t* my_decoded = decoded + math_wg * 2 * Layout::kDecodedBytes;

  // Decodes k-block `kb` (ring stage `s`) of this warpgroup's 128 weight rows into buffer kb & 1.
  auto decode = [&](int s, int kb, int decode_exponent) {
    decode_fp4_row<kFormat, kDecodeChunksInFlight>(
        fp4_tiles + s * Layout::kFp4Bytes + math_wg * 128 * kW4a8Fp4RowBytes,
        scale_tiles + s * Layout::kScaleBytes + math_wg * 128 * kScaleBytesPerRow,
        my_decoded + (kb & 1) * Layout::kDecodedBytes, thread_in_wg, decode_exponent);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  };

  int stage = 0;
  uint32_t phase = 0;
  int expert = 0;
  float accumulator[kSubTilesM][64];
  float partial[64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates where = locate_tile(table, tile, n_tiles, kBlockM, expert);
    int rows[kSubTilesM][2];
    bool valid[kSubTilesM][2];
    const float* a_scales[kSubTilesM][2];
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rows[s][h] = where.m0 + row_in_tile + 64 * s + 8 * h;
        valid[s][h] = rows[s][h] < where.m_end;
        a_scales[s][h] = params.a_scales + static_cast<int64_t>(valid[s][h] ? rows[s][h] : 0) * k_blocks;
      }
    const int n_block = where.n_tile * 2 + math_wg;
    const W4a8BlockScaleDevice* blocks = params.blocks + (static_cast<int64_t>(expert) * n_blocks + n_block) * k_blocks;

#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int i = 0; i < 64; ++i) accumulator[s][i] = 0.0f;

    // Every warp of this warpgroup has retired the previous tile's wgmmas (which read decoded buffer 0
    // or 1) before any warp overwrites buffer 0.
    named_barrier_sync(2 + math_wg, 128);
    // Block records {factor, p} are loaded one k-block ahead (with the A scales), off the decode's path.
    W4a8BlockScaleDevice next_block = load_block(blocks);
    barrier_wait(&full[stage], phase);
    decode(stage, 0, next_block.decode_exponent);

    float next_scale_a[kSubTilesM][2];
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) next_scale_a[s][h] = valid[s][h] ? __ldg(a_scales[s][h]) : 0.0f;
    for (int kb = 0; kb < k_blocks; ++kb) {
      float scale_a[kSubTilesM][2];
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) scale_a[s][h] = next_scale_a[s][h];
      const float factor = next_block.factor;
      if (kb + 1 < k_blocks) {
#pragma unroll
        for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h) next_scale_a[s][h] = valid[s][h] ? __ldg(a_scales[s][h] + kb + 1) : 0.0f;
        next_block = load_block(blocks + kb + 1);
      }
      named_barrier_sync(2 + math_wg, 128);  // every row of decoded kb is written and fenced
      const uint32_t b_base = smem_address(my_decoded + (kb & 1) * Layout::kDecodedBytes);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s) {
        const uint32_t a_base = smem_address(a_tiles + stage * Layout::kABytes + 64 * s * kBlockK);
#pragma unroll
        for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
        wgmma_fence();
#pragma unroll
        for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
          wgmma_m64n128k32_e4m3(partial, make_kmajor_sw128_descriptor(a_base + k_step * 32),
                                make_kmajor_sw128_descriptor(b_base + k_step * 32), k_step > 0 ? 1u : 0u);
        wgmma_commit();
        if (s == 0 && kb + 1 < k_blocks) {  // decode the next k-block while the tensor cores run
          const int next_stage = stage + 1 == kStages ? 0 : stage + 1;
          barrier_wait(&full[next_stage], next_stage == 0 ? phase ^ 1 : phase);
          decode(next_stage, kb + 1, next_block.decode_exponent);
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
        if (s == kSubTilesM - 1) {
          if (lane == 0) barrier_arrive(&empty[stage]);
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
        const float scale0 = scale_a[s][0] * factor, scale1 = scale_a[s][1] * factor;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          accumulator[s][4 * j + 0] += partial[4 * j + 0] * scale0;
          accumulator[s][4 * j + 1] += partial[4 * j + 1] * scale0;
          accumulator[s][4 * j + 2] += partial[4 * j + 2] * scale1;
          accumulator[s][4 * j + 3] += partial[4 * j + 3] * scale1;
        }
      }
    }

    // Accumulator fragment of wgmma m64n128: register 4j+{0,1} = (row, 8j + 2*(lane%4) + {0,1}),
    // register 4j+{2,3} = (row + 8, same columns).
    if constexpr (kEpilogue == W4a8Epilogue::kStoreBf16) {
      auto* out = static_cast<__nv_bfloat16*>(params.out);
      const int col_base = where.n_tile * kW4a8BlockN + math_wg * 128 + 2 * (lane % 4);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!valid[s][h]) continue;
          __nv_bfloat16* out_row = out + static_cast<int64_t>(rows[s][h]) * params.n + col_base;
#pragma unroll
          for (int j = 0; j < 16; ++j)
            *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j) =
                __floats2bfloat162_rn(accumulator[s][4 * j + 2 * h], accumulator[s][4 * j + 2 * h + 1]);
        }
    } else {
      // Gate warpgroup -> up warpgroup through shared memory, kExchangeRegisters registers per thread at a
      // time in register order (both see the same (row, column) per slot); the up warpgroup activates,
      // quantizes (formats::quantize_fp8_activations rule) and stores.
      constexpr int kChunk = Layout::kExchangeRegisters;
      const int out_cols = params.n / 2;
      auto* out = static_cast<uint8_t*>(params.out);
      const int col_base = where.n_tile * 128 + 2 * (lane % 4);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s) {
        float amax[2] = {0.0f, 0.0f};
#pragma unroll
        for (int chunk = 0; chunk < 64 / kChunk; ++chunk) {
          if (math_wg == 0) {
#pragma unroll
            for (int r = 0; r < kChunk; ++r) exchange[r * 128 + thread_in_wg] = accumulator[s][chunk * kChunk + r];
          }
          named_barrier_sync(1, 256);
          if (math_wg == 1) {
#pragma unroll
            for (int r = 0; r < kChunk; ++r) {
              const int i = chunk * kChunk + r;
              const float value = w4a8_activate(exchange[r * 128 + thread_in_wg], accumulator[s][i],
                                                params.activation, params.limit, params.alpha);
              accumulator[s][i] = value;
              amax[(i % 4) / 2] = fmaxf(amax[(i % 4) / 2], fabsf(value));
            }
          }
          named_barrier_sync(1, 256);  // the exchange buffer is free again
        }
        if (math_wg == 1) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
            if (!valid[s][h]) continue;
            // amax |fl(v * w)| = fl(amax |v| * |w|) (rounding is monotonic), so the weight multiplies here.
            const float weight = params.topk_weights ? params.topk_weights[rows[s][h]] : 1.0f;
            const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax[h], fabsf(weight)), 1e-10f), 448.0f);
            uint8_t* out_row = out + static_cast<int64_t>(rows[s][h]) * out_cols + col_base;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const float2 pair = make_float2(__fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * h], weight), scale),
                                              __fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * h + 1], weight), scale));
              *reinterpret_cast<__nv_fp8x2_storage_t*>(out_row + 8 * j) =
                  __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
            }
            if (lane % 4 == 0) params.out_scales[static_cast<int64_t>(rows[s][h]) * (out_cols / 128) + where.n_tile] = scale;
          }
        }
      }
    }
  }
}

}  // namespace megamoe::kernels::sm90

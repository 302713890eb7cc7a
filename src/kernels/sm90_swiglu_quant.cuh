// Pass 2 of the two-pass FP8 GEMM 1 (docs/grouped_gemm.md "Two-pass GEMM 1"): SwiGLU (+ top-k weight) +
// FP8 requantization of the BF16 gate/up values a plain grouped GEMM wrote. Memory-bound, no tensor cores.
//
//   in   [m_capacity, 2I] BF16, row-major, columns in the packed W13 order (GemmRole::kGateUp):
//        column 256 j + i = gate 128 j + i, column 256 j + 128 + i = up 128 j + i   (i < 128)
//   out  [m_capacity, I] E4M3 + out_scales [m_capacity, I/128] FP32 (= formats::Fp8Activations, what
//        GEMM 2 reads), for the rows [offsets[0], offsets[E]) (clamped to m_capacity) only.
//
// Work unit = (row, 128-output block j) = one half-warp: lane l (0..15) reads gate 8 l .. 8 l + 7 and up
// 8 l .. 8 l + 7 of block j (two 16-byte loads: a half-warp reads the block's 256 gate bytes and 256 up
// bytes contiguously), activates its 8 values, the half-warp reduces the amax (4 xor shuffles), applies
// the top-k weight, quantizes, and stores 8 codes (one 8-byte store; the half-warp writes the block's 128
// contiguous bytes); lane 0 writes the scale. Consecutive half-warps take consecutive j of one row, then
// the next row, so a CTA (16 half-warps) walks whole rows of both tensors.
//
// NOTES:
// - Bit-identical to the fused GEMM-1 epilogues (swiglu_quant_fp8_finish_rows, swiglu_quant_fp8_spread_epilogue,
//   swiglu_quant_fp8_rows_epilogue) whenever their FP32 gate / up accumulators equal the BF16 values read here
//   (e.g. exactly representable inputs): per element the same activate(gate, up) (the function of
//   sm90_fp8_grouped_gemm.cuh, kind a compile-time constant), the amax as fmaxf over the same 128 |values|
//   (exact, order-free), then weight = topk[row] (1.0f without top-k), scale = fdiv(max(fmul(amax, |weight|),
//   1e-10), 448), codes = cvt_e4m3x2_satfinite(fdiv(fmul(v, weight), scale)) on the same column pairs.
// - Only offsets[0] and offsets[E] are read (rows between them belong to some expert: they are contiguous
//   and non-decreasing, grouped_gemm.h); the host never reads them. The grid is a grid-stride loop over
//   units sized by the caller from m_capacity (an upper bound), so a launch does not depend on the row
//   count (CUDA-graph safe); CTAs past the last unit exit at once.
// - The shuffles name the half-warp's 16 lanes (mask 0xFFFF << 16 h), so the two half-warps of a warp may
//   leave the loop at different iterations.
// - Loads go through the read-only path (the input was written by an earlier kernel); rows of no expert are
//   neither read nor written.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/sm90_fp8_grouped_gemm.cuh"  // activate(): the fused epilogues' activation, shared

namespace megamoe::kernels::sm90 {

constexpr int kSwigluQuantThreads = 256;                            // 8 warps = 16 half-warps per CTA
constexpr int kSwigluQuantUnitsPerCta = kSwigluQuantThreads / 16;   // (row, block) units per CTA per step

struct SwigluQuantParams {
  const uint16_t* in = nullptr;              // BF16 [m_capacity, 2I]
  const int32_t* expert_offsets = nullptr;   // [E+1], device
  const float* topk_weights = nullptr;       // optional [m_capacity]
  uint8_t* out = nullptr;                    // E4M3 [m_capacity, I]
  float* out_scales = nullptr;               // [m_capacity, I/128]
  int m_capacity = 0, num_experts = 0, intermediate = 0;
  float limit = 0.f, alpha = 0.f;
};

__device__ __forceinline__ float bf16_low(uint32_t word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float bf16_high(uint32_t word) { return __uint_as_float(word & 0xFFFF0000u); }

template <int kActivation, bool kTopk>
__global__ void __launch_bounds__(kSwigluQuantThreads) sm90_swiglu_quant_fp8_kernel(const SwigluQuantParams p) {
  const int first = min(max(__ldg(p.expert_offsets), 0), p.m_capacity);
  const int end = min(max(__ldg(p.expert_offsets + p.num_experts), first), p.m_capacity);
  const int blocks_per_row = p.intermediate / 128;
  const int lane = threadIdx.x % 16;
  const unsigned half_mask = 0xFFFFu << (threadIdx.x & 16);
  const int64_t in_cols = 2 * static_cast<int64_t>(p.intermediate);
  // Unit u = (row first + u / blocks_per_row, block u % blocks_per_row); the grid-stride step is split the same
  // way once, so the loop advances (row, block) without a division.
  const int start = blockIdx.x * kSwigluQuantUnitsPerCta + threadIdx.x / 16;  // < 2^31: the grid is bounded
  const int step = gridDim.x * kSwigluQuantUnitsPerCta;
  const int step_rows = step / blocks_per_row, step_blocks = step % blocks_per_row;
  int block = start % blocks_per_row;
  for (int64_t row = first + start / blocks_per_row; row < end; row += step_rows) {
    const uint16_t* gate_src = p.in + row * in_cols + block * 256 + 8 * lane;
    const uint4 gate_bits = __ldg(reinterpret_cast<const uint4*>(gate_src));
    const uint4 up_bits = __ldg(reinterpret_cast<const uint4*>(gate_src + 128));
    const float weight = kTopk ? __ldg(p.topk_weights + row) : 1.0f;
    const uint32_t gw[4] = {gate_bits.x, gate_bits.y, gate_bits.z, gate_bits.w};
    const uint32_t uw[4] = {up_bits.x, up_bits.y, up_bits.z, up_bits.w};
    float h[8];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[2 * i] = activate(bf16_low(gw[i]), bf16_low(uw[i]), kActivation, p.limit, p.alpha);
      h[2 * i + 1] = activate(bf16_high(gw[i]), bf16_high(uw[i]), kActivation, p.limit, p.alpha);
      amax = fmaxf(amax, fabsf(h[2 * i]));
      amax = fmaxf(amax, fabsf(h[2 * i + 1]));
    }
#pragma unroll
    for (int offset = 1; offset < 16; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(half_mask, amax, offset));
    // Same rule as formats::quantize_fp8_activations (IEEE divisions, RNE, saturating), in the fused
    // epilogues' order (see NOTES).
    const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax, fabsf(weight)), 1e-10f), 448.0f);
    uint32_t codes[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t low = __nv_cvt_float2_to_fp8x2(
          make_float2(__fdiv_rn(__fmul_rn(h[4 * i], weight), scale), __fdiv_rn(__fmul_rn(h[4 * i + 1], weight), scale)),
          __NV_SATFINITE, __NV_E4M3);
      const uint32_t high = __nv_cvt_float2_to_fp8x2(
          make_float2(__fdiv_rn(__fmul_rn(h[4 * i + 2], weight), scale),
                      __fdiv_rn(__fmul_rn(h[4 * i + 3], weight), scale)),
          __NV_SATFINITE, __NV_E4M3);
      codes[i] = low | (high << 16);
    }
    *reinterpret_cast<uint2*>(p.out + row * p.intermediate + block * 128 + 8 * lane) = make_uint2(codes[0], codes[1]);
    if (lane == 0) p.out_scales[row * blocks_per_row + block] = scale;
    block += step_blocks;
    if (block >= blocks_per_row) {
      block -= blocks_per_row;
      ++row;
    }
  }
}

}  // namespace megamoe::kernels::sm90

// Two-pass FP8 GEMM 1 (docs/grouped_gemm.md "Two-pass GEMM 1"): the typed, validating API.
//
//   pass 1  grouped_gemm_fp8_bf16out (grouped_gemm.h, the plain entry point GEMM 2 shares) with n = 2I,
//           k = hidden on the W13 packed GemmRole::kGateUp: BF16 gate/up [m_capacity, 2I], columns in the
//           packed order (256 j + i = gate 128 j + i, 256 j + 128 + i = up 128 j + i)
//   pass 2  swiglu_quant_fp8 below: activation, optional top-k weight, FP8 requantization per row per 128
//           into exactly the GEMM-1 outputs (formats::Fp8Activations, what GEMM 2 reads)
//
//   __global__ kernel   src/kernels/sm90_swiglu_quant.cuh
//   launcher + API      src/kernels/swiglu_quant.cu (checks: swiglu_quant_args.cpp, also in CPU-only builds)
//
// Numerics of pass 2, per row r of an expert and output block j (128 columns):
//   h[c]  = activate(gate[r, c], up[r, c]) in FP32 (the GEMM-1 epilogue's activate(): kSiluMul
//           g / (1 + expf(-g)) * u; kSwigluClamped g' / (1 + expf(-alpha g')) * (u' + 1), g' = min(g, limit),
//           u' = clamp(u, -limit, limit))
//   w     = topk_weights[r], or 1 without them
//   scale = fdiv_rn(max(fmul_rn(max_c |h[c]|, |w|), 1e-10), 448)
//   q[c]  = e4m3_rn_satfinite(fdiv_rn(fmul_rn(h[c], w), scale))
// i.e. the fused GEMM-1 epilogue's operations in its order, so the two-pass outputs equal the fused ones bit
// for bit whenever the fused kernel's FP32 gate / up accumulators are exactly representable in BF16; else
// they differ by the BF16 rounding of gate / up (relative <= 2^-8) propagated through the activation.
#pragma once

#include <cstdint>

#include "grouped_gemm.h"  // by its own directory: bench/ includes this header as src/kernels/swiglu_quant.h
#include "megamoe/types.h"

namespace megamoe::kernels {

struct SwigluQuantFp8Args {
  const uint16_t* in = nullptr;             // [m_capacity, 2*intermediate] BF16 bits, packed gate/up order
  const int32_t* expert_offsets = nullptr;  // device [E+1]; only offsets[0] and offsets[E] are read
  const float* topk_weights = nullptr;      // optional, [m_capacity], one weight per row
  uint8_t* out = nullptr;                   // [m_capacity, intermediate] E4M3
  float* out_scales = nullptr;              // [m_capacity, intermediate/128]
  int64_t m_capacity = 0;
  int num_experts = 0, intermediate = 0;
  Activation activation{};
};

// Requirements (megamoe::Error names the field and the limit): m_capacity in [1, 2^31), num_experts in
// [1, 1024], intermediate a positive multiple of 128 with m_capacity * 2 * intermediate < 2^62, in / out /
// out_scales / expert_offsets non-null and 16-byte aligned, topk_weights 4-byte aligned when given,
// activation.limit > 0 for kSwigluClamped. Checked before any CUDA call (CPU-only builds have it too).
void check_swiglu_quant_fp8_args(const SwigluQuantFp8Args& args);

// Pass 2 alone. One launch, no host synchronization, no allocation; the grid depends on m_capacity only.
void swiglu_quant_fp8(const SwigluQuantFp8Args& args, cudaStream_t stream);

// Both passes: `args` as for grouped_gemm1_fp8, with args.packing == GemmRole::kGateUp (kGateUpInterleaved8:
// megamoe::Error; v9_skew_kblocks is ignored), `gate_up` a BF16 buffer of m_capacity * 2 * intermediate
// elements (16-byte aligned). The plain GEMM gets args' schedule and rows hint.
void grouped_gemm1_fp8_two_pass(const GroupedGemm1Fp8Args& args, uint16_t* gate_up, cudaStream_t stream);

// MEGAMOE_FP8_GEMM1_TWO_PASS: unset / empty / "0" -> false, "1" -> true, anything else megamoe::Error.
// The staged backend reads it once at creation (staged_backend.cu).
bool fp8_gemm1_two_pass_from_env();

}  // namespace megamoe::kernels

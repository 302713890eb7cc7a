// GEMM 1 epilogue of the staged backend as its own kernel: h [rows, 2I] fp32 (gate cols then up cols)
//   -> act = silu(gate) * up            (kSiluMul:       gate / (1 + expf(-gate)) * up)
//      or  g = min(gate, limit), u = clamp(up, -limit, limit), act = g / (1 + expf(-alpha g)) * (u + 1)
//   -> act *= topk weight of the row    (apply_topk_in_fc1 only)
//   -> FP8 per 128 columns (scale = max(amax, 1e-10) / 448, __fdiv_rn, RNE, saturating) or BF16 (RNE).
// One warp per row; rows past expert_offsets[E] are skipped (device-side count).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "megamoe/ep_dispatch.h"
#include "megamoe/error_cuda.h"
#include "megamoe/types.h"

namespace megamoe::kernels {

struct SwigluQuantArgs {
  const float* h;                  // [rows, 2I]
  const int32_t* offsets;          // [E + 1]; rows = offsets[E]
  int num_experts, intermediate;
  int activation;                  // 0 silu-mul, 1 swiglu clamped
  float limit, alpha;
  const RowSource* sources;        // weights for apply_topk_in_fc1, else null
  bool fp8;
  uint8_t* out_fp8;                // [rows, I]
  float* out_scales;               // [rows, I/128]
  __nv_bfloat16* out_bf16;         // [rows, I]
};

__device__ __forceinline__ float staged_activation(const SwigluQuantArgs& a, float gate, float up) {
  if (a.activation == 0) return gate / (1.0f + expf(-gate)) * up;
  const float g = fminf(gate, a.limit), u = fminf(fmaxf(up, -a.limit), a.limit);
  return g / (1.0f + expf(-a.alpha * g)) * (u + 1.0f);
}

__global__ void __launch_bounds__(256) swiglu_quant_kernel(SwigluQuantArgs a) {
  const int lane = threadIdx.x & 31;
  const int rows = a.offsets[a.num_experts], I = a.intermediate;
  for (int m = blockIdx.x * 8 + (threadIdx.x >> 5); m < rows; m += gridDim.x * 8) {
    const float* h = a.h + static_cast<size_t>(m) * 2 * I;
    const float weight = a.sources ? a.sources[m].weight : 1.0f;
    for (int g0 = 0; g0 < I; g0 += 128) {
      float v[4];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = g0 + lane * 4 + i;
        v[i] = c < I ? staged_activation(a, h[c], h[I + c]) : 0.0f;
        if (a.sources) v[i] *= weight;
        amax = fmaxf(amax, fabsf(v[i]));
      }
      if (a.fp8) {
        for (int d = 16; d >= 1; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
        const float scale = __fdiv_rn(fmaxf(amax, 1e-10f), 448.0f);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = g0 + lane * 4 + i;
          if (c < I)
            a.out_fp8[static_cast<size_t>(m) * I + c] =
                __nv_cvt_float_to_fp8(__fdiv_rn(v[i], scale), __NV_SATFINITE, __NV_E4M3);
        }
        if (lane == 0) a.out_scales[static_cast<size_t>(m) * (I / 128) + g0 / 128] = scale;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = g0 + lane * 4 + i;
          if (c < I) a.out_bf16[static_cast<size_t>(m) * I + c] = __float2bfloat16_rn(v[i]);
        }
      }
    }
  }
}

inline void launch_swiglu_quant(const SwigluQuantArgs& a, cudaStream_t stream) {
  swiglu_quant_kernel<<<1024, 256, 0, stream>>>(a);
  MEGAMOE_LAUNCH_CHECK();
}

}  // namespace megamoe::kernels

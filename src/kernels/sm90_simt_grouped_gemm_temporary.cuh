// TEMPORARY expert GEMM for the `staged` backend until the grouped-GEMM kernels (branch `gemm`,
// src/kernels/grouped_gemm.h) are merged. Correct, graph-capturable, and slow (CUDA cores, fp32):
//   out[m, n] = sum_k A[m, k] * B_e[n, k]   for the rows m of local expert e (device-side offsets)
//   A: e4m3 with one fp32 scale per row per 128 columns, or bf16.
//   B: e4m3 with one fp32 scale per 128x128 block (DeepSeek weight_scale_inv), or bf16.
// Dequantized values are exact in fp32; accumulation is fp32 fmaf in increasing k.
// NOTES: tiles never straddle experts: grid.y enumerates (expert, 64-row tile) pairs; blocks past the
// last real tile exit. Replace with the wgmma kernels; do not optimise this file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "megamoe/error_cuda.h"

namespace megamoe::kernels::temporary {

inline constexpr int kTileM = 64, kTileN = 64, kTileK = 32;

struct SimtGemmArgs {
  const void* a;              // [rows, K]
  const float* a_scales;      // [rows, K/128] or null (bf16)
  const void* b;              // [E_local, N, K]
  const float* b_scales;      // [E_local, ceil(N/128), ceil(K/128)] or null (bf16)
  const int32_t* offsets;     // [E_local + 1] device
  int num_experts, n, k;
  bool a_fp8, b_fp8;
  float* out_f32;             // [rows, N] or null
  __nv_bfloat16* out_bf16;    // [rows, N] or null
};

__device__ __forceinline__ float e4m3_value(uint8_t q) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
  return __half2float(__half(h));
}

__global__ void __launch_bounds__(256) simt_grouped_gemm_kernel(SimtGemmArgs g) {
  // Find this block's (expert, tile).
  int tile = blockIdx.y, expert = -1, row_begin = 0, row_end = 0;
  for (int e = 0; e < g.num_experts; ++e) {
    const int begin = g.offsets[e], end = g.offsets[e + 1];
    const int tiles = (end - begin + kTileM - 1) / kTileM;
    if (tile < tiles) {
      expert = e;
      row_begin = begin + tile * kTileM;
      row_end = min(end, row_begin + kTileM);
      break;
    }
    tile -= tiles;
  }
  if (expert < 0) return;
  const int n0 = blockIdx.x * kTileN;
  __shared__ float a_tile[kTileK][kTileM + 1];
  __shared__ float b_tile[kTileK][kTileN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // 16 x 16 threads, 4 x 4 outputs each
  float acc[4][4] = {};
  const int kb = (g.k + 127) / 128, nb = (g.n + 127) / 128;
  const size_t b_expert = static_cast<size_t>(expert) * g.n * g.k;
  for (int k0 = 0; k0 < g.k; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTileM * kTileK; i += blockDim.x) {
      const int r = i / kTileK, kk = i % kTileK, m = row_begin + r, kg = k0 + kk;
      float v = 0.0f;
      if (m < row_end && kg < g.k) {
        if (g.a_fp8) {
          v = e4m3_value(static_cast<const uint8_t*>(g.a)[static_cast<size_t>(m) * g.k + kg]) *
              g.a_scales[static_cast<size_t>(m) * kb + kg / 128];
        } else {
          v = __bfloat162float(static_cast<const __nv_bfloat16*>(g.a)[static_cast<size_t>(m) * g.k + kg]);
        }
      }
      a_tile[kk][r] = v;
    }
    for (int i = threadIdx.x; i < kTileN * kTileK; i += blockDim.x) {
      const int c = i / kTileK, kk = i % kTileK, n = n0 + c, kg = k0 + kk;
      float v = 0.0f;
      if (n < g.n && kg < g.k) {
        const size_t at = b_expert + static_cast<size_t>(n) * g.k + kg;
        if (g.b_fp8) {
          v = e4m3_value(static_cast<const uint8_t*>(g.b)[at]) *
              g.b_scales[(static_cast<size_t>(expert) * nb + n / 128) * kb + kg / 128];
        } else {
          v = __bfloat162float(static_cast<const __nv_bfloat16*>(g.b)[at]);
        }
      }
      b_tile[kk][c] = v;
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kTileK; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(a_tile[kk][ty * 4 + i], b_tile[kk][tx * 4 + j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int m = row_begin + ty * 4 + i;
    if (m >= row_end) continue;
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx * 4 + j;
      if (n >= g.n) continue;
      if (g.out_f32) g.out_f32[static_cast<size_t>(m) * g.n + n] = acc[i][j];
      else g.out_bf16[static_cast<size_t>(m) * g.n + n] = __float2bfloat16_rn(acc[i][j]);
    }
  }
}

inline void launch_simt_grouped_gemm(const SimtGemmArgs& g, int64_t max_rows, cudaStream_t stream) {
  const int64_t tiles = (max_rows + kTileM - 1) / kTileM + g.num_experts;
  MEGAMOE_CHECK(tiles < 65536 * 32, "temporary grouped GEMM: too many row tiles (", tiles, ")");
  if (tiles == 0) return;
  const dim3 grid((g.n + kTileN - 1) / kTileN, static_cast<unsigned>(std::min<int64_t>(tiles, 65535)));
  MEGAMOE_CHECK(tiles <= 65535, "temporary grouped GEMM: ", tiles, " row tiles exceed grid.y 65535");
  simt_grouped_gemm_kernel<<<grid, 256, 0, stream>>>(g);
  MEGAMOE_LAUNCH_CHECK();
}

}  // namespace megamoe::kernels::temporary

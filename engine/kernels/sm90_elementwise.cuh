// Small bandwidth-bound kernels of the GPU model runner: embedding gather, SiLU-and-mul. One thread
// per element, grid-stride loops; no shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace megamoe::engine::kernels {

// x[t, i] = float(embed[ids[t], i]); grid-stride over T * H.
__global__ void embedding_kernel(const __nv_bfloat16* __restrict__ embed, int64_t hidden,
                                 const int32_t* __restrict__ ids, int64_t tokens, float* __restrict__ x) {
  const int64_t total = tokens * hidden;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / hidden, c = i - t * hidden;
    x[i] = __bfloat162float(embed[static_cast<int64_t>(ids[t]) * hidden + c]);
  }
}

// out[t, i] = silu(g) * u with g = gate_up[t, i], u = gate_up[t, I + i]; fp32 math like the CPU
// runner (x / (1 + exp(-x))), one bf16 rounding at the end.
__global__ void silu_mul_kernel(const __nv_bfloat16* __restrict__ gate_up, int64_t tokens, int64_t intermediate,
                                __nv_bfloat16* __restrict__ out) {
  const int64_t total = tokens * intermediate;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / intermediate, c = i - t * intermediate;
    const float g = __bfloat162float(gate_up[t * 2 * intermediate + c]);
    const float u = __bfloat162float(gate_up[t * 2 * intermediate + intermediate + c]);
    out[i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
  }
}

// Grid for a grid-stride loop over `count` elements: enough blocks to fill the GPU, never zero.
inline unsigned elementwise_blocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace megamoe::engine::kernels
